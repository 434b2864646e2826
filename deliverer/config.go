package deliverer

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/outbox"
)

// Defaults of the deliverer's own knobs.
const (
	ConcurrencyDefault            = 128
	ConsumerDefault               = "aurora-deliverer"
	AckWaitSecondsDefault         = 30
	ProviderTimeoutSecondsDefault = 30
	BusyDelayMillisDefault        = 50
	ShutdownSecondsDefault        = 30
	PinnedTTLSecondsDefault       = 10
	StreamLingerMillisDefault     = 2
	BatchLingerMillisDefault      = 2
)

// DefaultFilterSubject is the consumer filter of the default pool: every
// tenant of the Stripe meter events exporter.
func DefaultFilterSubject() string {
	return outbox.SubjectPrefix + "." + outbox.TenantToken(outbox.DefaultExporter) + ".>"
}

// Config is the deliverer's configuration, loaded from AURORA_* variables
// with config.Load. Seed 000's knobs come from config.Outbox.
type Config struct {
	config.Outbox
	// Concurrency: provider calls in flight in this process, and messages
	// pulled ahead. AURORA_DELIVERER_CONCURRENCY, default 128, 1..4096.
	Concurrency int `env:"DELIVERER_CONCURRENCY" envDefault:"128"`
	// Consumer: durable JetStream consumer name shared by every replica of a
	// pool. AURORA_DELIVERER_CONSUMER, default "aurora-deliverer".
	Consumer string `env:"DELIVERER_CONSUMER" envDefault:"aurora-deliverer"`
	// FilterSubject: the pool's subjects without the partition token,
	// aurora.outbox.<exporter>.<tenant-token>, e.g.
	// aurora.outbox.stripe_meter_events.org_123 for a tenant pool, or ending
	// in ">" for every tenant; several separated by commas. Each partition
	// consumer filters these with its partition appended (FilterFor).
	// AURORA_DELIVERER_FILTER_SUBJECT, default every tenant of
	// stripe_meter_events.
	FilterSubject string `env:"DELIVERER_FILTER_SUBJECT"`
	// PinnedTTLSeconds: how long a partition stays pinned to a deliverer
	// that stopped pulling (killed, partitioned away) before JetStream pins
	// a standby: the take-over time of a dead owner's partitions.
	// AURORA_DELIVERER_PINNED_TTL_SECONDS, default 10, 1..600.
	PinnedTTLSeconds int `env:"DELIVERER_PINNED_TTL_SECONDS" envDefault:"10"`
	// AckWaitSeconds: JetStream redelivers a message whose handler went
	// silent this long; a handler heartbeats (InProgress) every third of it.
	// AURORA_DELIVERER_ACK_WAIT_SECONDS, default 30, 5..3600.
	AckWaitSeconds int `env:"DELIVERER_ACK_WAIT_SECONDS" envDefault:"30"`
	// ProviderTimeoutSeconds: deadline of one provider call (also the HTTP
	// client's timeout). Must be shorter than the lease so a live worker
	// records its outcome before its lease expires.
	// AURORA_STRIPE_TIMEOUT_SECONDS, default 30, 1..lease−1.
	ProviderTimeoutSeconds int `env:"STRIPE_TIMEOUT_SECONDS" envDefault:"30"`
	// BusyDelayMillis: NakWithDelay when the row is locked by another
	// transaction (typically the relay, which holds the row until its
	// PubAck is recorded); jittered ±50 %. AURORA_DELIVERER_BUSY_DELAY_MS,
	// default 50, 10..60000.
	BusyDelayMillis int `env:"DELIVERER_BUSY_DELAY_MS" envDefault:"50"`
	// ShutdownSeconds: on SIGTERM, how long in-flight calls may finish and
	// record their outcome before they are cancelled (a cancelled call is a
	// retry with the same key). AURORA_DELIVERER_SHUTDOWN_SECONDS, default
	// 30, 1..600.
	ShutdownSeconds int `env:"DELIVERER_SHUTDOWN_SECONDS" envDefault:"30"`
	// StreamLingerMillis: how long a v2 meter event stream request (for
	// accounts provisioned --exporter stream) that is not full waits for
	// more lanes' events before it is sent; up to 100 events go in one.
	// AURORA_DELIVERER_STREAM_LINGER_MS, default 2, 1..100.
	StreamLingerMillis int `env:"DELIVERER_STREAM_LINGER_MS" envDefault:"2"`
	// BatchLingerMillis: how long a busy claim or outcome runner (its last
	// statement carried more than one lane's group, or the other runner of
	// its kind is running one) waits for more groups before it runs a batch
	// under AURORA_OUTBOX_BATCH_SIZE items; a quiet runner never waits
	// (batch.go). AURORA_DELIVERER_BATCH_LINGER_MS, default 2, 0..100 (0:
	// never wait).
	BatchLingerMillis int `env:"DELIVERER_BATCH_LINGER_MS" envDefault:"2"`
}

// StreamLinger is StreamLingerMillis as a duration.
func (c Config) StreamLinger() time.Duration {
	return time.Duration(c.StreamLingerMillis) * time.Millisecond
}

// DefaultConfig returns the defaults, as config.Load would with an empty
// environment.
func DefaultConfig() Config {
	return Config{
		Outbox: config.Outbox{
			LeaseSeconds: 120, MaxAttempts: 20, BatchSize: 100,
			BackoffBaseSeconds: 5, BackoffCapSeconds: 900, UncertaintyHorizonSeconds: 82800,
		},
		Concurrency:            ConcurrencyDefault,
		Consumer:               ConsumerDefault,
		FilterSubject:          DefaultFilterSubject(),
		AckWaitSeconds:         AckWaitSecondsDefault,
		ProviderTimeoutSeconds: ProviderTimeoutSecondsDefault,
		BusyDelayMillis:        BusyDelayMillisDefault,
		ShutdownSeconds:        ShutdownSecondsDefault,
		PinnedTTLSeconds:       PinnedTTLSecondsDefault,
		StreamLingerMillis:     StreamLingerMillisDefault,
		BatchLingerMillis:      BatchLingerMillisDefault,
	}
}

// Validate checks every knob and names the variable and its range (each
// error is a *config.RangeError wrapping config.ErrInvalid). An empty
// FilterSubject is replaced by DefaultFilterSubject.
func (c *Config) Validate() error {
	if c.FilterSubject == "" {
		c.FilterSubject = DefaultFilterSubject()
	}
	var consumer, filter error
	if strings.TrimSpace(c.Consumer) == "" || strings.ContainsAny(c.Consumer, " .*>\t") {
		consumer = &config.RangeError{Var: config.Prefix + "DELIVERER_CONSUMER", Value: c.Consumer, Allowed: "a non-empty name without spaces, '.', '*' or '>'"}
	}
	for _, f := range strings.Split(c.FilterSubject, ",") {
		if _, err := FilterFor(f, 0); err != nil {
			filter = &config.RangeError{Var: config.Prefix + "DELIVERER_FILTER_SUBJECT", Value: c.FilterSubject,
				Allowed: "comma-separated subjects " + outbox.SubjectPrefix + ".<exporter>.<tenant-token>, either token may be '*', or ending in '>'"}
		}
	}
	// The call must end within the lease; judged only between a lease and
	// a timeout each in range (else the one error is that one's), and
	// blamed on whichever of them was set (config.Load).
	timeout := config.IntRange("STRIPE_TIMEOUT_SECONDS", c.ProviderTimeoutSeconds, 1, 3599, "seconds")
	if timeout == nil && config.IntRange("OUTBOX_LEASE_SECONDS", c.LeaseSeconds, 5, 3600, "") == nil {
		timeout = config.Relation("STRIPE_TIMEOUT_SECONDS", c.ProviderTimeoutSeconds, "<", "OUTBOX_LEASE_SECONDS", c.LeaseSeconds,
			"a Stripe call must end within the item's lease")
	}
	return errors.Join(
		c.Outbox.Validate(),
		config.IntRange("DELIVERER_CONCURRENCY", c.Concurrency, 1, 4096, "calls"),
		consumer, filter,
		config.IntRange("DELIVERER_ACK_WAIT_SECONDS", c.AckWaitSeconds, 5, 3600, "seconds"),
		timeout,
		config.IntRange("DELIVERER_BUSY_DELAY_MS", c.BusyDelayMillis, 10, 60000, "milliseconds"),
		config.IntRange("DELIVERER_SHUTDOWN_SECONDS", c.ShutdownSeconds, 1, 600, "seconds"),
		config.IntRange("DELIVERER_PINNED_TTL_SECONDS", c.PinnedTTLSeconds, 1, 600, "seconds"),
		config.IntRange("DELIVERER_STREAM_LINGER_MS", c.StreamLingerMillis, 1, 100, "milliseconds"),
		config.IntRange("DELIVERER_BATCH_LINGER_MS", c.BatchLingerMillis, 0, 100, "milliseconds"),
	)
}

// settings are the durations the deliverer runs with: the validated Config,
// optionally overridden by Options (tests use sub-second values the
// environment cannot express).
type settings struct {
	lease           time.Duration
	maxAttempts     int
	batch           int
	backoffBase     time.Duration
	backoffCap      time.Duration
	horizon         time.Duration
	concurrency     int
	consumer        string
	filterSubjects  []string
	ackWait         time.Duration
	heartbeat       time.Duration
	providerTimeout time.Duration
	busyDelay       time.Duration
	shutdown        time.Duration
	pinnedTTL       time.Duration
	attachCheck     time.Duration
	laneShare       int
	batchLinger     time.Duration
}

func (c Config) settings() settings {
	sec := func(n int) time.Duration { return time.Duration(n) * time.Second }
	return settings{
		lease:           sec(c.LeaseSeconds),
		maxAttempts:     c.MaxAttempts,
		batch:           c.BatchSize,
		backoffBase:     sec(c.BackoffBaseSeconds),
		backoffCap:      sec(c.BackoffCapSeconds),
		horizon:         sec(c.UncertaintyHorizonSeconds),
		concurrency:     c.Concurrency,
		consumer:        c.Consumer,
		filterSubjects:  strings.Split(c.FilterSubject, ","),
		ackWait:         sec(c.AckWaitSeconds),
		heartbeat:       sec(c.AckWaitSeconds) / 3,
		providerTimeout: sec(c.ProviderTimeoutSeconds),
		busyDelay:       time.Duration(c.BusyDelayMillis) * time.Millisecond,
		shutdown:        sec(c.ShutdownSeconds),
		pinnedTTL:       sec(c.PinnedTTLSeconds),
		attachCheck:     2 * time.Second,
		laneShare:       2 * max(c.BatchSize, 1),
		batchLinger:     time.Duration(c.BatchLingerMillis) * time.Millisecond,
	}
}

// FilterFor returns the filter of partition p for a pool subject f
// (AURORA_DELIVERER_FILTER_SUBJECT's form): f with the partition token
// appended, a trailing ">" standing for the exporter and tenant tokens it
// covers (aurora.outbox.stripe_meter_events.> → …stripe_meter_events.*.<p>).
// Errors: a subject that is not aurora.outbox.<exporter>.<tenant> with
// tokens or wildcards, nor a prefix of it ending in ">".
func FilterFor(f string, p int) (string, error) {
	toks := strings.Split(f, ".")
	bad := fmt.Errorf("deliverer: filter subject %q: want %s.<exporter>.<tenant-token> or a prefix ending in '>'", f, outbox.SubjectPrefix)
	if len(toks) < 3 || toks[0]+"."+toks[1] != outbox.SubjectPrefix {
		return "", bad
	}
	for i, t := range toks {
		if t == "" || strings.ContainsAny(t, " \t") || (t == ">" && i != len(toks)-1) ||
			(t != "*" && t != ">" && strings.ContainsAny(t, "*>")) {
			return "", bad
		}
	}
	if toks[len(toks)-1] == ">" {
		toks = toks[:len(toks)-1]
		for len(toks) < 4 {
			toks = append(toks, "*")
		}
	}
	if len(toks) != 4 {
		return "", bad
	}
	return strings.Join(append(toks, fmt.Sprint(p)), "."), nil
}
