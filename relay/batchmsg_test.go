package relay

import (
	"context"
	"fmt"
	"strings"
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

// batchLanes counts the distinct lanes of the i-th message after the
// first 12 (0 when it is not a batch).
func batchLanes(t *testing.T, js jetstream.JetStream, subject string, i int) int {
	t.Helper()
	if !isBatchSubject(subject) {
		return 0
	}
	s, err := js.Stream(context.Background(), outbox.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(context.Background(), info.State.FirstSeq+12+uint64(i))
	if err != nil {
		t.Fatal(err)
	}
	b, err := outbox.DecodeBatch(m.Data)
	if err != nil {
		t.Fatal(err)
	}
	lanes := map[string]bool{}
	for _, e := range b.Items {
		lanes[e.Lane] = true
	}
	return len(lanes)
}

// batchFixture: a database, an embedded JetStream and a relay
// configuration with AURORA_RELAY_BATCH_MESSAGE_ITEMS at items.
func batchFixture(t *testing.T, items int) (*pgxpool.Pool, jetstream.JetStream, Config) {
	t.Helper()
	pool := newPool(t)
	_, js := connect(t, natstest.New(t))
	cfg := testConfig()
	cfg.BatchMessageItems = items
	return pool, js, cfg
}

// TestBatchMessagesOnlyWhereAConsumerAcceptsThem: with
// AURORA_RELAY_BATCH_MESSAGE_ITEMS at 10, items go out one message each
// while no consumer says its deliverers accept batches, and in batch
// messages of at most 10 (on the batch subject, every item once) once one
// does — noticed within batchSubjectsTTL of the relay's clock.
func TestBatchMessagesOnlyWhereAConsumerAcceptsThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, js, cfg := batchFixture(t, 10)
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
	var many []outbox.Item // 40 lanes (a lane per tenant here) over 16 partitions
	for i := range 40 {
		many = append(many, item(fmt.Sprintf("org_b%d", i), 100+i))
	}
	second := stageTogether(t, pool, many...) // one commit: the relay takes them in one batch
	eventually(t, "52 published", func() (bool, error) { n, err := publishedCount(ctx, pool); return n == 52, err })
	subjects, carried = batchedMsgs(t, js)
	subjects, carried = subjects[12:], carried[12:]
	seen := map[int64]int{}
	for i, ids := range carried {
		if len(ids) > 10 {
			t.Fatalf("message %d carries %d items, more than 10", i, len(ids))
		}
		if lanes := batchLanes(t, js, subjects[i], i); len(ids) > 1 && lanes != len(ids) {
			t.Fatalf("message %d carries %d items of %d lanes: at most one item of a lane a message", i, len(ids), lanes)
		}
		if len(ids) > 1 && !isBatchSubject(subjects[i]) {
			t.Fatalf("batch on %q", subjects[i])
		}
		for _, id := range ids {
			seen[id]++
		}
	}
	// 40 items in 16 partitions: some partition holds two lanes or more,
	// so some message is a batch (concurrent workers may split the take,
	// never into single messages only).
	batches := 0
	for _, ids := range carried {
		if len(ids) > 1 {
			batches++
		}
	}
	if batches == 0 || len(carried) >= 40 {
		t.Fatalf("%d messages, %d of them batches, for 40 items committed together", len(carried), batches)
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

// TestChunksHoldOneItemOfALane: each batch at most size items and at most
// one item of a lane; items keep their order; nothing lost.
func TestChunksHoldOneItemOfALane(t *testing.T) {
	t.Parallel()
	mk := func(lanes ...string) []claimed {
		out := make([]claimed, len(lanes))
		for i, l := range lanes {
			// UnmappedLane of (account, tenant, feature): one lane per tenant here.
			out[i] = claimed{id: int64(i + 1), tenant: l, account: "acct_1", feature: "f"}
		}
		return out
	}
	ids := func(cs [][]claimed) [][]int64 {
		var out [][]int64
		for _, c := range cs {
			var row []int64
			for _, it := range c {
				row = append(row, it.id)
			}
			out = append(out, row)
		}
		return out
	}
	cases := []struct {
		name  string
		lanes []string
		size  int
		want  string
	}{
		{"distinct lanes fill batches", []string{"a", "b", "c", "d", "e"}, 2, "[[1 2] [3 4] [5]]"},
		{"one hot lane: one item a message", []string{"a", "a", "a"}, 10, "[[1] [2] [3]]"},
		{"mixed", []string{"a", "a", "b", "c", "a"}, 2, "[[1 3] [2 4] [5]]"},
		{"hot and cold", []string{"h", "h", "c1", "h", "c2", "c3"}, 10, "[[1 3 5 6] [2] [4]]"},
		{"size one", []string{"a", "b"}, 1, "[[1] [2]]"},
	}
	for _, c := range cases {
		if got := fmt.Sprint(ids(chunks(mk(c.lanes...), c.size))); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

// TestBatchesStayInTheItemsPool: a tenant with a pool of its own (its
// consumer filters aurora.outbox.<exporter>.org_t.>) beside a default pool
// that lists its tenants and the batch token: the default pool's items
// travel in batches, the tenant's items never — one message each on the
// tenant's own subject — though both pools accept batches.
func TestBatchesStayInTheItemsPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, js, cfg := batchFixture(t, 50)
	if _, err := EnsureStream(ctx, js, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	exp := outbox.TenantToken(outbox.DefaultExporter)
	meta := map[string]string{outbox.MetaBatchMessages: "1"}
	if _, err := js.CreateOrUpdateConsumer(ctx, outbox.StreamName, jetstream.ConsumerConfig{
		Durable: "tenant-pool", AckPolicy: jetstream.AckExplicitPolicy, Metadata: meta,
		FilterSubject: outbox.SubjectPrefix + "." + exp + ".org_t.>",
	}); err != nil {
		t.Fatal(err)
	}
	defaults := []string{outbox.SubjectPrefix + "." + exp + "." + outbox.BatchToken + ".>"}
	for i := range 30 {
		defaults = append(defaults, outbox.SubjectPrefix+"."+exp+fmt.Sprintf(".org_d%d.>", i))
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, outbox.StreamName, jetstream.ConsumerConfig{
		Durable: "default-pool", AckPolicy: jetstream.AckExplicitPolicy, Metadata: meta, FilterSubjects: defaults,
	}); err != nil {
		t.Fatal(err)
	}
	var all []outbox.Item
	for i := range 30 {
		all = append(all, item(fmt.Sprintf("org_d%d", i), i))
	}
	all = append(all, items("org_t", 100, 20)...)
	stageTogether(t, pool, all...)
	start(t, pool, js, cfg)
	eventually(t, "50 published", func() (bool, error) { n, err := publishedCount(ctx, pool); return n == 50, err })

	subjects, carried := batchedMsgs(t, js)
	tenantSubject := outbox.Subject(outbox.DefaultExporter, "org_t") + "."
	batches, tenantSingles := 0, 0
	for i, s := range subjects {
		if isBatchSubject(s) {
			batches++
			continue
		}
		if len(carried[i]) != 1 {
			t.Fatalf("message on %s carries %v", s, carried[i])
		}
		if strings.HasPrefix(s, tenantSubject) {
			tenantSingles++
		}
	}
	if tenantSingles != 20 {
		t.Fatalf("%d of the tenant pool's 20 items went out alone on its subject; the rest rode in batches", tenantSingles)
	}
	if batches == 0 {
		t.Fatal("no batch for the default pool's 30 items")
	}
}
