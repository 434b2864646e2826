package relay

import (
	"context"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// batchedMsgs reads the stream: per message its subject and the item ids
// it carries (one for a single message).
func batchedMsgs(t *testing.T, js jetstream.JetStream) (subjects []string, items [][]int64) {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, outbox.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("msg %d: %v", seq, err)
		}
		subjects = append(subjects, m.Subject)
		if m.Header.Get(outbox.HeaderBatch) == "" {
			body, err := outbox.DecodeMessage(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			items = append(items, []int64{body.ItemID})
			continue
		}
		b, err := outbox.DecodeBatch(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(jetstream.MsgIDHeader) != outbox.BatchMsgID(b) {
			t.Fatalf("batch Nats-Msg-Id %q", m.Header.Get(jetstream.MsgIDHeader))
		}
		var ids []int64
		for _, e := range b.Items {
			if err := e.Validate(); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, e.ItemID)
		}
		items = append(items, ids)
	}
	return subjects, items
}

// TestBatchMessagesOnlyWhereAConsumerAcceptsThem: with
// AURORA_RELAY_BATCH_MESSAGE_ITEMS at 10, items go out one message each
// while no consumer says its deliverers accept batches, and in batch
// messages of at most 10 (on the batch subject, every item once) once one
// does — noticed within batchSubjectsTTL of the relay's clock.
func TestBatchMessagesOnlyWhereAConsumerAcceptsThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := natstest.New(t)
	pool := newPool(t)
	_, js := connect(t, srv)
	cfg := testConfig()
	cfg.BatchMessageItems = 10
	clk := clock.NewManual(time.Now().Add(time.Minute)) // ahead of the database: staged rows are due at once
	start(t, pool, js, cfg, WithClock(clk))

	first := stage(t, pool, items("org_1", 0, 12)...)
	eventually(t, "12 published", func() (bool, error) { n, err := publishedCount(ctx, pool); return n == 12, err })
	subjects, carried := batchedMsgs(t, js)
	if len(subjects) != 12 {
		t.Fatalf("%d messages without a consumer that accepts batches, want 12 singles", len(subjects))
	}
	once := map[int64]int{}
	for i, ids := range carried {
		if len(ids) != 1 {
			t.Fatalf("message %d carries %v, want one item", i, ids)
		}
		once[ids[0]]++
	}
	for _, id := range first {
		if once[id] != 1 {
			t.Fatalf("item %d in %d messages", id, once[id])
		}
	}

	// A consumer that accepts batches (as a deliverer's partition consumers
	// do) on every outbox subject; the relay reads it once its reading is
	// older than batchSubjectsTTL.
	if _, err := js.CreateOrUpdateConsumer(ctx, outbox.StreamName, jetstream.ConsumerConfig{
		Durable: "batch-taker", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: outbox.SubjectPrefix + ".>",
		Metadata: map[string]string{outbox.MetaBatchMessages: "1"},
	}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(batchSubjectsTTL + time.Second)
	second := stageTogether(t, pool, items("org_1", 100, 25)...) // one commit: the relay takes them in one batch
	eventually(t, "37 published", func() (bool, error) { n, err := publishedCount(ctx, pool); return n == 37, err })
	subjects, carried = batchedMsgs(t, js)
	subjects, carried = subjects[12:], carried[12:]
	seen := map[int64]int{}
	for i, ids := range carried {
		if len(ids) > 10 {
			t.Fatalf("message %d carries %d items, more than 10", i, len(ids))
		}
		if len(ids) > 1 && !isBatchSubject(subjects[i]) {
			t.Fatalf("batch on %q", subjects[i])
		}
		for _, id := range ids {
			seen[id]++
		}
	}
	// One take holds all 25 (10, 10, 5); concurrent workers may split the
	// take, but never into single messages only.
	batches := 0
	for _, ids := range carried {
		if len(ids) > 1 {
			batches++
		}
	}
	if batches == 0 || len(carried) >= 25 {
		t.Fatalf("%d messages, %d of them batches, for 25 items of one lane committed together", len(carried), batches)
	}
	for _, id := range second {
		if seen[id] != 1 {
			t.Fatalf("item %d carried %d times", id, seen[id])
		}
	}
}

func isBatchSubject(s string) bool {
	for p := range outbox.PartitionsDefault {
		if s == outbox.BatchSubject(outbox.DefaultExporter, p) {
			return true
		}
	}
	return false
}

// stageTogether commits items in one transaction and returns their ids.
func stageTogether(t *testing.T, pool *pgxpool.Pool, items ...outbox.Item) []int64 {
	t.Helper()
	var ids []int64
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		for _, it := range items {
			row, err := outbox.Stage(context.Background(), tx, it)
			if err != nil {
				return err
			}
			ids = append(ids, row.ID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}
