package relay

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/nats-io/nats.go/jetstream"
)

func TestEnsureStreamCreatesThenUpdatesIdempotently(t *testing.T) {
	t.Parallel()
	_, js := connect(t, natstest.New(t))
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		s, err := EnsureStream(ctx, js, DefaultStreamConfig())
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		c := s.CachedInfo().Config
		if c.Name != outbox.StreamName || c.Retention != jetstream.WorkQueuePolicy || c.Storage != jetstream.FileStorage ||
			c.Replicas != 1 || c.Duplicates != 2*time.Minute || len(c.Subjects) != 1 || c.Subjects[0] != "aurora.outbox.>" {
			t.Fatalf("call %d: stream config %+v", i, c)
		}
	}
	s, err := EnsureStream(ctx, js, StreamConfig{Replicas: 1, DuplicateWindowSeconds: 600, Partitions: outbox.PartitionsDefault})
	if err != nil {
		t.Fatal(err)
	}
	if d := s.CachedInfo().Config.Duplicates; d != 10*time.Minute {
		t.Fatalf("duplicate window %s after update, want 10m", d)
	}
}

func TestEnsureStreamRefusals(t *testing.T) {
	t.Parallel()
	_, js := connect(t, natstest.New(t))
	ctx := context.Background()
	if _, err := EnsureStream(ctx, js, StreamConfig{Replicas: 0, DuplicateWindowSeconds: 120}); !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("replicas 0: err %v, want config.ErrInvalid", err)
	}
	// An operator made the stream with memory storage: JetStream refuses to
	// change storage, so the relay refuses to start rather than guess.
	cfg := StreamConfigFor(DefaultStreamConfig())
	cfg.Storage = jetstream.MemoryStorage
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureStream(ctx, js, DefaultStreamConfig()); !errors.Is(err, ErrStreamConfig) {
		t.Fatalf("err %v, want ErrStreamConfig", err)
	}
	pool := newPool(t)
	r, err := New(pool, js, testConfig(), WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.Run(rctx); !errors.Is(err, ErrStreamConfig) {
		t.Fatalf("Run: %v, want ErrStreamConfig", err)
	}
	if err := r.Run(rctx); !errors.Is(err, ErrAlreadyRun) {
		t.Fatalf("second Run: %v, want ErrAlreadyRun", err)
	}
}

// An operator deletes the stream under a running relay: publishes find no
// stream, the relay ensures it again and publishes what is due.
func TestDeletedStreamIsRecreated(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	ctx := context.Background()
	start(t, pool, js, testConfig())
	stage(t, pool, item("org_d", 1))
	eventually(t, "first row published", func() (bool, error) {
		n, err := publishedCount(ctx, pool)
		return n == 1, err
	})
	if err := js.DeleteStream(ctx, outbox.StreamName); err != nil {
		t.Fatal(err)
	}
	stage(t, pool, items("org_d", 2, 5)...)
	eventually(t, "rows published into the recreated stream", func() (bool, error) {
		n, err := publishedCount(ctx, pool)
		return n == 6, err
	})
	if n, err := streamCount(js); err != nil || n != 5 {
		t.Fatalf("recreated stream holds %d (err %v), want 5", n, err)
	}
}

// A relay of another outbox database refuses the stream a first relay made,
// naming both databases; changing the partition count of a stream that holds
// messages is refused.
func TestEnsureStreamRefusesAnotherDatabaseAndRepartitioning(t *testing.T) {
	t.Parallel()
	_, js := connect(t, natstest.New(t))
	ctx := context.Background()
	a := DefaultStreamConfig()
	a.Database = "7001/db_a/outbox_items"
	if _, err := EnsureStream(ctx, js, a); err != nil {
		t.Fatal(err)
	}
	b := a
	b.Database = "7001/db_b/outbox_items"
	_, err := EnsureStream(ctx, js, b)
	if !errors.Is(err, ErrForeignStream) || !strings.Contains(err.Error(), a.Database) || !strings.Contains(err.Error(), b.Database) {
		t.Fatalf("err %v, want ErrForeignStream naming both databases", err)
	}
	// A caller that names no database (the demo's set-up) keeps the owner.
	anon := a
	anon.Database = ""
	s, err := EnsureStream(ctx, js, anon)
	if err != nil || s.CachedInfo().Config.Metadata[outbox.MetaDatabase] != a.Database {
		t.Fatalf("anonymous ensure: %v, metadata %v", err, s.CachedInfo().Config.Metadata)
	}
	if _, err := js.Publish(ctx, outbox.PartitionSubject(outbox.DefaultExporter, "org_1", 0), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	re := a
	re.Partitions = 8
	if _, err := EnsureStream(ctx, js, re); !errors.Is(err, ErrStreamConfig) {
		t.Fatalf("repartitioning a non-empty stream: %v, want ErrStreamConfig", err)
	}
}

// answering is JetStream whose stream calls all get err.
type answering struct {
	jetstream.JetStream
	err error
}

func (a answering) Stream(context.Context, string) (jetstream.Stream, error) { return nil, a.err }
func (a answering) CreateOrUpdateStream(context.Context, jetstream.StreamConfig) (jetstream.Stream, error) {
	return nil, a.err
}

// JetStream refusing the stream stops the relay with ErrStreamConfig;
// JetStream not able to answer (503, 10008: no leader, no quorum) is an
// outage the relay retries (the chaos long run saw relays exit on it).
func TestEnsureStreamTellsRefusalFromUnavailable(t *testing.T) {
	t.Parallel()
	_, js := connect(t, natstest.New(t))
	for _, c := range []struct {
		name    string
		err     error
		refused bool
	}{
		{"503 no leader", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, false},
		{"500 refused (10052)", &jetstream.APIError{Code: 500, ErrorCode: 10052, Description: "stream configuration update can not change storage type"}, true},
	} {
		_, err := EnsureStream(context.Background(), answering{js, c.err}, DefaultStreamConfig())
		if err == nil || errors.Is(err, ErrStreamConfig) != c.refused {
			t.Errorf("%s: err %v, want refused=%v", c.name, err, c.refused)
		}
	}
}
