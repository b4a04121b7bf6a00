package handler_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/handler"
	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/service"
)

// Every process that sends must have every handler the config names (any
// worker may own any tenant's partition): a program without it, and a
// stock throttler (no handlers) as --role all or worker, refuse to start,
// naming the key; a stock --role api process takes the config.
func TestAHandlerNobodyRegisteredIsRefused(t *testing.T) {
	t.Parallel()
	body := `
[downstreams.web]
url = "http://127.0.0.1:9/send"
[downstreams.sms]
handler = "sms"
[tenant_defaults]
downstream = "sms"
`
	file := writeConfig(t, body)
	mux := handler.NewMux()
	mux.HandleFunc("email", func(context.Context, *handler.Job) ([]byte, error) { return nil, nil })
	err := handler.Run(context.Background(), handler.Options{ConfigFile: file, Handlers: mux})
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Key != "downstreams.sms.handler" || !strings.Contains(ce.Reason, `it has "email"`) {
		t.Fatalf("a program without the handler: %v, want a refusal naming downstreams.sms.handler", err)
	}
	cfg, err := config.Load(file, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	err = service.Run(context.Background(), service.Options{Config: cfg, Logger: quiet})
	if !errors.As(err, &ce) || ce.Key != "downstreams.sms.handler" || !strings.Contains(ce.Reason, "--role api") {
		t.Fatalf("a stock throttler: %v, want a refusal naming downstreams.sms.handler and --role api", err)
	}
}
