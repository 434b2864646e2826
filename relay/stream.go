package relay

import (
	"context"
	"fmt"
	"github.com/aurora-billing/aurora/shared/jsapi"
	"slices"
	"strconv"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/nats-io/nats.go/jetstream"
)

// StreamSubjects are the subjects of the AURORA_OUTBOX stream:
// aurora.outbox.<exporter>.<tenant-token>.<partition> (outbox.PartitionSubject).
var StreamSubjects = []string{outbox.SubjectPrefix + ".>"}

// StreamConfigFor returns the JetStream configuration of the AURORA_OUTBOX
// stream: work-queue retention (a message leaves the stream when a deliverer
// acks it), file storage, cfg's replicas and duplicate window, and metadata
// naming the partition count and (when cfg.Database is set) the outbox
// database.
func StreamConfigFor(cfg StreamConfig) jetstream.StreamConfig {
	meta := map[string]string{outbox.MetaPartitions: strconv.Itoa(cfg.Partitions)}
	if cfg.Database != "" {
		meta[outbox.MetaDatabase] = cfg.Database
	}
	return jetstream.StreamConfig{
		Metadata:    meta,
		Name:        outbox.StreamName,
		Description: "aurora export outbox: item is ready for an attempt (Postgres is the truth)",
		Subjects:    StreamSubjects,
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  time.Duration(cfg.DuplicateWindowSeconds) * time.Second,
		Discard:     jetstream.DiscardOld,
	}
}

// EnsureStream creates the AURORA_OUTBOX stream or updates it to cfg; it is
// idempotent and safe to call from every relay, deliverer and the demo at
// start. cfg is validated first (a *config.RangeError on a bad knob). A
// stream that exists with settings JetStream refuses to change (retention,
// storage, another stream owning the subjects) returns an error wrapping
// ErrStreamConfig; other errors (no JetStream reachable) are returned as they
// come and are worth retrying.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	want := StreamConfigFor(cfg)
	if cur, err := js.Stream(ctx, outbox.StreamName); err == nil {
		info := cur.CachedInfo()
		have := info.Config.Metadata
		if db := have[outbox.MetaDatabase]; db != "" && cfg.Database != "" && db != cfg.Database {
			return nil, fmt.Errorf("%w: stream %s belongs to outbox database %s, this relay's is %s",
				ErrForeignStream, outbox.StreamName, db, cfg.Database)
		}
		if db := have[outbox.MetaDatabase]; db != "" && cfg.Database == "" {
			want.Metadata[outbox.MetaDatabase] = db // keep the recorded owner
		}
		if p := have[outbox.MetaPartitions]; p != "" && p != want.Metadata[outbox.MetaPartitions] && info.State.Msgs > 0 {
			return nil, fmt.Errorf("%w: stream %s has %d message(s) on %s partitions; AURORA_OUTBOX_PARTITIONS=%d needs it drained first",
				ErrStreamConfig, outbox.StreamName, info.State.Msgs, p, cfg.Partitions)
		}
		// Leave a stream that already has our settings alone: every relay
		// start would otherwise rewrite it, and nats-server v2.15.2 races a
		// stream update against a concurrent consumer creation (a data race
		// the race detector reports, seen when deliverers start beside a
		// relay).
		if managedEqual(info.Config, want) {
			return cur, nil
		}
	}
	s, err := js.CreateOrUpdateStream(ctx, want)
	if err != nil {
		if jsapi.Refused(err) { // a 5xx (no leader, no quorum) is worth retrying
			return nil, fmt.Errorf("%w: %s: %w", ErrStreamConfig, outbox.StreamName, err)
		}
		return nil, fmt.Errorf("relay: ensure stream %s: %w", outbox.StreamName, err)
	}
	return s, nil
}

// managedEqual reports whether have already carries every setting
// StreamConfigFor manages.
func managedEqual(have, want jetstream.StreamConfig) bool {
	return have.Description == want.Description && slices.Equal(have.Subjects, want.Subjects) &&
		have.Retention == want.Retention && have.Storage == want.Storage && have.Replicas == want.Replicas &&
		have.Duplicates == want.Duplicates && have.Discard == want.Discard &&
		have.Metadata[outbox.MetaPartitions] == want.Metadata[outbox.MetaPartitions] &&
		have.Metadata[outbox.MetaDatabase] == want.Metadata[outbox.MetaDatabase]
}
