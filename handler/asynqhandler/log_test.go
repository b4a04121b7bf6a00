package asynqhandler_test

import (
	"io"
	"log/slog"
	"testing"
)

// testLogger drops the service's log (the test says what went wrong).
func testLogger(*testing.T) *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
