package deliverer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/streamexport"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Environment of the re-executed test binary that TestMustShowKill9Between
// StreamOKAndOutcome kills.
const (
	killChildMarker = "DELIVERER_TEST_KILL_MARKER" // file the child writes once the stream answered 200
	killChildDB     = "DELIVERER_TEST_KILL_DB"
	killChildNATS   = "DELIVERER_TEST_KILL_NATS"
	killChildAPI    = "DELIVERER_TEST_KILL_API"
	killChildKey    = "DELIVERER_TEST_KILL_KEY" // the item key to hang on
)

// Child process timings: the shortest AckWait and pinned TTL, so the
// partition and message are free soon after the kill.
const (
	killAckWait   = 5 * time.Second
	killPinnedTTL = time.Second
)

// hangAfter200 passes each group to the stream and, once the stream has
// accepted the watched key, announces it in the marker file and hangs
// before returning: the results never reach the outcome write, which is
// where kill -9 lands.
type hangAfter200 struct {
	streamexport.Router
	key, marker string
}

func (x hangAfter200) ExportGroup(ctx context.Context, rs []deliverer.Request) []deliverer.Result {
	res := x.Router.ExportGroup(ctx, rs)
	for i, r := range rs {
		if r.Key == x.key && res[i].Outcome == deliverer.OutcomeAccepted {
			if err := os.WriteFile(x.marker, []byte(res[i].RequestID), 0o600); err != nil {
				panic(err)
			}
			select {} // the 200 is in, the outcome unwritten
		}
	}
	return res
}

// TestStreamKillChildProcess is the deliverer process the must-show below
// kills: a deliverer with the stream exporter that hangs after the 200.
func TestStreamKillChildProcess(t *testing.T) {
	marker := os.Getenv(killChildMarker)
	if marker == "" {
		t.Skip("run by TestMustShowKill9BetweenStreamOKAndOutcome")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(killChildDB))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	nc, err := nats.Connect(os.Getenv(killChildNATS))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	api := os.Getenv(killChildAPI)
	v1, err := stripeexport.New(stripeexport.Config{APIKey: testKey, APIBase: api}, 10*time.Second, 8)
	if err != nil {
		t.Fatal(err)
	}
	st, err := streamexport.New(streamexport.Config{Client: streamexport.ClientConfig{APIKey: testKey, APIBase: api, Timeout: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	exp := hangAfter200{Router: streamexport.Router{V1: v1, Stream: st}, key: os.Getenv(killChildKey), marker: marker}
	d, err := deliverer.New(pool, js, exp, testConfig(), deliverer.WithLogger(quietLogger()),
		deliverer.WithAckWait(killAckWait), deliverer.WithPinnedTTL(killPinnedTTL))
	if err != nil {
		t.Fatal(err)
	}
	_ = d.Run(ctx) // until killed
}

// Must show: kill -9 of a deliverer process between a stream 200 and its
// outcome write. The child process (this test binary re-executed) claims
// the item, sends it in a stream request, gets 200 {} (the emulator has
// applied it) and is killed before it writes the outcome: the item stays
// leased under token 1 and no attempt is recorded. Once the lease expires
// the relay's sweep dispatches the item again (here: redispatch) and
// another deliverer resends it (recording the killed lease's attempt as
// stale_lease) under the same identifier, with the same request body; the
// emulator, which counts applications per identifier, has it already:
// applied once, no duplicate application, the item accepted under the
// next lease token.
func TestMustShowKill9BetweenStreamOKAndOutcome(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	h.exec(`UPDATE stripe_accounts SET exporter = 'stream' WHERE account_id = $1`, acct)
	row := h.stage(h.item("org_1", "event:kill9", 6))

	marker := filepath.Join(t.TempDir(), "after-200")
	child := exec.Command(os.Args[0], "-test.run=^TestStreamKillChildProcess$", "-test.count=1")
	child.Env = append(os.Environ(), killChildMarker+"="+marker, killChildDB+"="+h.pool.Config().ConnString(),
		killChildNATS+"="+h.nats.URL(), killChildAPI+"="+h.srv.URL, killChildKey+"="+row.IdempotencyKey)
	child.Stdout, child.Stderr = os.Stderr, os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = child.Process.Kill()
			_ = child.Wait()
		}
	}()
	h.publish(row.ID)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the child's stream 200")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := h.emu.Applications(row.IdempotencyKey); n != 1 {
		t.Fatalf("before the kill the stream applied the event %d times, want 1", n)
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := child.Wait()
	killed = true
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want killed by SIGKILL", err)
	}
	if got := h.get(row.ID); got.State != outbox.StateLeased || got.LeaseToken != 1 {
		t.Fatalf("after the kill: %s with lease token %d, want leased with token 1 (outcome unwritten)", got.State, got.LeaseToken)
	}
	if got := h.attempts(row.ID); len(got) != 0 {
		t.Fatalf("after the kill, attempt rows %+v, want none (the outcome write records the attempt)", got)
	}

	// The lease expires (the child claimed on the database's clock; the
	// harness clock runs ahead of it), the sweep dispatches the item again
	// and a new deliverer process sends it.
	lease := time.Duration(testConfig().LeaseSeconds) * time.Second
	h.clk.Advance(lease + time.Minute)
	exp, _ := h.streamRouter()
	h.startExp(testConfig(), exp, deliverer.WithAckWait(killAckWait), deliverer.WithPinnedTTL(killPinnedTTL))
	h.redispatch(row.ID)
	final := h.awaitState(row.ID, outbox.StateAccepted)
	if final.LeaseToken != 2 {
		t.Fatalf("accepted with lease token %d, want 2", final.LeaseToken)
	}
	if n := h.emu.Applications(row.IdempotencyKey); n != 1 || len(h.emu.DuplicateApplications()) != 0 {
		t.Fatalf("applied %d times, duplicates %v; want once", n, h.emu.DuplicateApplications())
	}
	reqs := h.emu.RequestsFor(row.IdempotencyKey)
	if len(reqs) != 2 {
		t.Fatalf("%d requests carried the item, want 2 (the killed send and the resend)", len(reqs))
	}
	for _, r := range reqs {
		if r.Route != stripeemulator.RouteMeterEventStream || r.Status != 200 || len(r.Identifiers) != 1 ||
			r.Identifiers[0] != row.IdempotencyKey || r.BodySHA256 != reqs[0].BodySHA256 {
			t.Fatalf("request %+v, want two identical stream requests under the item's identifier", r)
		}
	}
	// The take-over wrote the killed lease's attempt as stale_lease
	// (lease_taken_over); the resend's is accepted.
	got := h.attempts(row.ID)
	if fmt.Sprint(outcomes(got)) != "[stale_lease accepted]" || got[0].ErrorCode == nil || *got[0].ErrorCode != "lease_taken_over" || got[1].LeaseToken != 2 {
		t.Fatalf("attempt outcomes by token %v (%+v), want the killed lease stale_lease/lease_taken_over, the resend accepted under token 2", outcomes(got), got)
	}
}
