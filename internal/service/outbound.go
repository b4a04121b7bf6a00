package service

import (
	"errors"
	"maps"
	"slices"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/outbound"
)

// outboundSet is one config with its downstreams compiled for sending
// (internal/outbound): their secrets and TLS files read, their allow-lists
// parsed. A reload makes a new one.
type outboundSet struct {
	cfg    *config.Config
	byName map[string]*outbound.Downstream
	// callbacks signs callbacks ([callbacks]; nil: not configured).
	callbacks *outbound.Signer
}

// compileOutbound compiles every downstream of cfg. The error is the first
// refused, a *config.Error naming its key (and cfg's file), never a
// secret's value.
func compileOutbound(cfg *config.Config) (*outboundSet, error) {
	set := &outboundSet{cfg: cfg, byName: make(map[string]*outbound.Downstream, len(cfg.Downstreams))}
	for _, name := range slices.Sorted(maps.Keys(cfg.Downstreams)) {
		o, err := outbound.Compile(name, cfg.Downstreams[name])
		if err != nil {
			var ce *config.Error
			if errors.As(err, &ce) && ce.File == "" {
				ce.File = cfg.File
			}
			return nil, err
		}
		set.byName[name] = o
	}
	if cfg.Callbacks.Enabled() {
		signer, err := outbound.CompileSigner("callbacks", cfg.Callbacks.SigningRef())
		if err != nil {
			var ce *config.Error
			if errors.As(err, &ce) && ce.File == "" {
				ce.File = cfg.File
			}
			return nil, err
		}
		set.callbacks = signer
	}
	return set, nil
}

// all is every downstream of the set.
func (s *outboundSet) all() []*outbound.Downstream {
	return slices.Collect(maps.Values(s.byName))
}

// outbound is a downstream's compiled rules by name, as the config now
// has them (nil: no such downstream): api.Options.Outbound.
func (r *running) outbound(name string) *outbound.Downstream {
	return r.out.Load().byName[name]
}

// errorKey is the config key a refused config names ("" if none).
func errorKey(err error) string {
	var ce *config.Error
	if errors.As(err, &ce) {
		return ce.Key
	}
	return ""
}
