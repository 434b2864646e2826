package deliverer_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/aurora-billing/aurora/internal/syncbuf"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/relay"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/prometheus/client_golang/prometheus"
)

// Must show (issue 19): a deliverer pointed at a second database beside a
// running pipeline (a wrong AURORA_DATABASE_URL sharing the NATS) refuses to
// start with an error naming both outbox databases, touches no message, and
// the pipeline's items are all accepted on their first dispatch: no
// re-dispatch sweep ran (the manual clock never moves, so the relay's 300 s
// sweep cannot), no item was attempted twice, nothing applied twice.
func TestMustShowSecondDatabaseRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHarness(t, stripeemulator.Faults{})
	rc := relay.DefaultConfig()
	rc.PollMS = 20
	h.runRelay(rc)
	ours, err := outbox.DatabaseID(ctx, h.pool)
	if err != nil {
		t.Fatal(err)
	}
	h.await("the relay stamps the stream with its database", func() bool {
		s, err := h.js.Stream(ctx, outbox.StreamName)
		return err == nil && s.CachedInfo().Config.Metadata[outbox.MetaDatabase] == ours
	})
	h.start(testConfig())
	start := h.clk.Now()

	// The second deployment's database: migrated, on the same cluster, with
	// its own item waiting (what a foreign deliverer would look up).
	other := dbtest.New(t)
	theirs, err := outbox.DatabaseID(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	if theirs == ours {
		t.Fatalf("both databases are %s", ours)
	}

	var rows []outbox.Row
	for i := range 20 {
		rows = append(rows, h.stage(h.item("org_1", fmt.Sprintf("event:fdb%d", i), int64(i+1))))
	}

	// Started while the items flow, same NATS, same consumer pool name.
	exp, err := stripeexport.New(stripeexport.Config{APIKey: testKey, APIBase: h.srv.URL}, 10*time.Second, 8)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	foreign, err := deliverer.New(other, h.js, exp, testConfig(), deliverer.WithClock(h.clk),
		deliverer.WithLogger(slog.New(slog.NewTextHandler(logs, nil))), deliverer.WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	runErr := foreign.Run(rctx)
	var fe *deliverer.ForeignDatabaseError
	if !errors.As(runErr, &fe) || !errors.Is(runErr, deliverer.ErrForeignDatabase) {
		t.Fatalf("foreign deliverer: Run = %v, want a *ForeignDatabaseError", runErr)
	}
	if msg := runErr.Error(); !strings.Contains(msg, ours) || !strings.Contains(msg, theirs) {
		t.Fatalf("refusal %q does not name both databases (%s, %s)", msg, ours, theirs)
	}
	t.Logf("refusal: %v", runErr)

	for _, r := range rows {
		got := h.awaitState(r.ID, outbox.StateAccepted)
		if got.Attempts != 1 || got.Dispatch != r.Dispatch {
			t.Fatalf("item %d accepted after %d attempts, dispatch %d -> %d: it waited for a re-dispatch", r.ID, got.Attempts, r.Dispatch, got.Dispatch)
		}
	}
	if !h.clk.Now().Equal(start) {
		t.Fatal("the clock moved: a sweep could have run")
	}
	if n := len(h.emu.Applied()); n != len(rows) || len(h.emu.DuplicateApplications()) != 0 {
		t.Fatalf("applied %d of %d, duplicates %v", n, len(rows), h.emu.DuplicateApplications())
	}
	var attempts int
	if err := other.QueryRow(ctx, `SELECT count(*) FROM outbox_attempts`).Scan(&attempts); err != nil || attempts != 0 {
		t.Fatalf("the foreign deliverer recorded %d attempts in its database (%v)", attempts, err)
	}
}
