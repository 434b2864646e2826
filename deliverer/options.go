package deliverer

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/prometheus/client_golang/prometheus"
)

// Option adjusts a Deliverer. Options validate themselves and return an
// error wrapping ErrInvalidOption.
type Option func(*Deliverer) error

// WithClock sets the clock whose Override is passed to SQL as "now"
// (default clock.DB{}: the database's now()). Tests pass a *clock.Manual.
func WithClock(c clock.Clock) Option {
	return func(d *Deliverer) error { d.clock = clock.Or(c); return nil }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(d *Deliverer) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		d.log = l
		return nil
	}
}

// WithRegisterer registers the deliverer's metrics on reg (default: a fresh
// private registry, i.e. metrics not exported).
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(d *Deliverer) error {
		if reg == nil {
			return fmt.Errorf("%w: nil registerer", ErrInvalidOption)
		}
		d.reg = reg
		return nil
	}
}

// WithAckWait overrides AckWait (and the InProgress heartbeat, a third of
// it) with a duration the environment cannot express, e.g. 600 ms in tests.
// Errors: ErrInvalidOption below 100 ms.
func WithAckWait(ackWait time.Duration) Option {
	return func(d *Deliverer) error {
		if ackWait < 100*time.Millisecond {
			return fmt.Errorf("%w: ack wait %s < 100ms", ErrInvalidOption, ackWait)
		}
		d.s.ackWait, d.s.heartbeat = ackWait, ackWait/3
		return nil
	}
}

// WithPinnedTTL overrides the pinned TTL of the partition consumers (how
// long a silent owner keeps its partitions before a standby takes them).
// Errors: ErrInvalidOption below 100 ms.
func WithPinnedTTL(ttl time.Duration) Option {
	return func(d *Deliverer) error {
		if ttl < 100*time.Millisecond {
			return fmt.Errorf("%w: pinned ttl %s < 100ms", ErrInvalidOption, ttl)
		}
		d.s.pinnedTTL = ttl
		return nil
	}
}

// WithAttachCheck overrides how often each consume loop checks that its
// consumer still exists with this deliverer's configuration (default 2 s).
// Errors: ErrInvalidOption below 10 ms.
func WithAttachCheck(every time.Duration) Option {
	return func(d *Deliverer) error {
		if every < 10*time.Millisecond {
			return fmt.Errorf("%w: attach check %s < 10ms", ErrInvalidOption, every)
		}
		d.s.attachCheck = every
		return nil
	}
}

// WithLease overrides the lease (default AURORA_OUTBOX_LEASE_SECONDS). With a
// clock.Manual the lease is measured on the manual clock.
func WithLease(lease time.Duration) Option {
	return func(d *Deliverer) error {
		if lease <= 0 {
			return fmt.Errorf("%w: lease %s", ErrInvalidOption, lease)
		}
		d.s.lease = lease
		return nil
	}
}

// WithBusyDelay overrides the NakWithDelay used when a row is locked by
// another transaction.
func WithBusyDelay(delay time.Duration) Option {
	return func(d *Deliverer) error {
		if delay <= 0 {
			return fmt.Errorf("%w: busy delay %s", ErrInvalidOption, delay)
		}
		d.s.busyDelay = delay
		return nil
	}
}

// WithProviderTimeout overrides the deadline of one provider call.
func WithProviderTimeout(timeout time.Duration) Option {
	return func(d *Deliverer) error {
		if timeout <= 0 {
			return fmt.Errorf("%w: provider timeout %s", ErrInvalidOption, timeout)
		}
		d.s.providerTimeout = timeout
		return nil
	}
}

// WithLaneShare overrides how many messages one lane may hold in this
// process (running and queued) before further ones are deferred (default
// twice AURORA_OUTBOX_BATCH_SIZE). Errors: ErrInvalidOption below 1.
func WithLaneShare(n int) Option {
	return func(d *Deliverer) error {
		if n < 1 {
			return fmt.Errorf("%w: lane share %d < 1", ErrInvalidOption, n)
		}
		d.s.laneShare = n
		return nil
	}
}

// WithJitter sets the source of backoff jitter: a function returning a
// uniform float64 in [0, 1) (default math/rand/v2). Tests pass a constant.
func WithJitter(rnd func() float64) Option {
	return func(d *Deliverer) error {
		if rnd == nil {
			return fmt.Errorf("%w: nil jitter source", ErrInvalidOption)
		}
		d.rnd = rnd
		return nil
	}
}
