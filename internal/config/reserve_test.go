package config

import (
	"errors"
	"strings"
	"testing"
)

// store.reserve: 64 MiB by default; a size in bytes or with a unit, from
// the file or the environment; anything else is refused naming the key.
func TestStoreReserve(t *testing.T) {
	t.Parallel()
	cfg, err := Load("", nil, nil)
	if err != nil || cfg.Store.Reserve != 64<<20 {
		t.Fatalf("default reserve %d (%v), want 64 MiB", cfg.Store.Reserve, err)
	}
	for body, want := range map[string]Bytes{
		"reserve = \"8MiB\"":   8 << 20,
		"reserve = \"1.5GiB\"": 3 << 29,
		"reserve = \"10MB\"":   10e6,
		"reserve = 4096":       4096,
		"reserve = \"0\"":      0,
	} {
		cfg, err := Load(writeFile(t, "[store]\n"+body+"\n"), nil, nil)
		if err != nil || cfg.Store.Reserve != want {
			t.Errorf("%s: %d (%v), want %d", body, cfg.Store.Reserve, err, want)
		}
	}
	cfg, err = Load("", []string{"THROTTLER_STORE_RESERVE=2MiB"}, nil)
	if err != nil || cfg.Store.Reserve != 2<<20 {
		t.Errorf("from the environment: %d (%v)", cfg.Store.Reserve, err)
	}
	for _, body := range []string{"reserve = \"lots\"", "reserve = \"5 parsecs\"", "reserve = -1", "reserve = \"-3MiB\""} {
		_, err := Load(writeFile(t, "[store]\n"+body+"\n"), nil, nil)
		var cerr *Error
		if !errors.As(err, &cerr) || cerr.Key != "store.reserve" || !strings.Contains(err.Error(), "64MiB") {
			t.Errorf("%s: %v, want a refusal of store.reserve saying how to write it", body, err)
		}
	}
}
