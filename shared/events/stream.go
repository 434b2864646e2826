package events

import (
	"context"
	"fmt"
	"github.com/aurora-billing/aurora/shared/jsapi"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamConfigFor returns the AURORA_EVENTS stream's configuration: subjects
// aurora.events.>, limits retention (a message stays for its max age
// whatever the consumers do, so each durable consumer reads at its own
// position and one that was down catches up), file storage, the duplicate
// window for Nats-Msg-Id.
func StreamConfigFor(cfg Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        StreamName,
		Description: "aurora domain events (Postgres event_outbox is the truth)",
		Subjects:    []string{SubjectPrefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.StreamReplicas,
		MaxAge:      cfg.streamMaxAge(),
		Duplicates:  time.Duration(cfg.DuplicateWindowSeconds) * time.Second,
		Discard:     jetstream.DiscardOld,
	}
}

// EnsureStream creates AURORA_EVENTS or updates it to cfg, leaving a stream
// that already matches alone. cfg is validated first (*config.RangeError).
// A configuration JetStream refuses wraps ErrStreamConfig; other errors (no
// JetStream reachable) are worth retrying.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	want := StreamConfigFor(cfg)
	if cur, err := js.Stream(ctx, StreamName); err == nil {
		have := cur.CachedInfo().Config
		if have.Description == want.Description && slices.Equal(have.Subjects, want.Subjects) &&
			have.Retention == want.Retention && have.Storage == want.Storage && have.Replicas == want.Replicas &&
			have.MaxAge == want.MaxAge && have.Duplicates == want.Duplicates && have.Discard == want.Discard {
			return cur, nil
		}
	}
	s, err := js.CreateOrUpdateStream(ctx, want)
	if err != nil {
		if jsapi.Refused(err) { // a 5xx (no leader, no quorum) is worth retrying
			return nil, fmt.Errorf("%w: %s: %w", ErrStreamConfig, StreamName, err)
		}
		return nil, fmt.Errorf("events: ensure stream %s: %w", StreamName, err)
	}
	return s, nil
}
