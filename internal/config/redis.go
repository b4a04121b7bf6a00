package config

import (
	"cmp"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// RedisClient is a client for the redis backend's Redis, as configured.
// It does not connect yet.
func (s Store) RedisClient() (redis.UniversalClient, error) {
	c, err := s.redisClient()
	if err != nil {
		return nil, fmt.Errorf("store.redis_url: %w", err)
	}
	return c, nil
}

// redisPoolSize is the connection pool's size unless the URL sets
// pool_size: workers hold many jobs at once, and go-redis's default (10 per
// CPU) would make their claims wait for a connection.
const redisPoolSize = 128

// ContextTimeoutEnabled is set in every mode: a partition's lease renewal
// must give up at its own deadline, not wait out go-redis's read timeout
// on a Redis that stopped answering (packets dropped, the connection left
// open).
//
// noRetries turns off go-redis's own retries, whatever the URL says: it
// replays a command whose answer was lost (a timeout, a dropped
// connection) even if Redis ran it, and a script replayed would decide
// twice (admit a job twice, take a second grant). The store retries what is
// safe to retry itself.
const noRetries = -1

func (s Store) redisClient() (redis.UniversalClient, error) {
	switch s.RedisMode {
	case "", "standalone":
		o, err := redis.ParseURL(s.RedisURL)
		if err != nil {
			return nil, err
		}
		o.PoolSize, o.MaxRetries, o.ContextTimeoutEnabled = cmp.Or(o.PoolSize, redisPoolSize), noRetries, true
		return redis.NewClient(o), nil
	case "sentinel":
		o, err := redis.ParseFailoverURL(s.RedisURL)
		if err != nil {
			return nil, err
		}
		if o.MasterName == "" {
			return nil, errors.New("a Sentinel URL needs ?master_name=NAME")
		}
		o.PoolSize, o.MaxRetries, o.ContextTimeoutEnabled = cmp.Or(o.PoolSize, redisPoolSize), noRetries, true
		return redis.NewFailoverClient(o), nil
	case "cluster":
		o, err := redis.ParseClusterURL(s.RedisURL)
		if err != nil {
			return nil, err
		}
		o.PoolSize, o.MaxRetries, o.ContextTimeoutEnabled = cmp.Or(o.PoolSize, redisPoolSize), noRetries, true
		return redis.NewClusterClient(o), nil
	}
	return nil, fmt.Errorf("store.redis_mode %q is not a mode: use \"standalone\", \"sentinel\" or \"cluster\"", s.RedisMode)
}
