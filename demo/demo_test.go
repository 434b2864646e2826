package demo

import (
	"bufio"
	"context"
	"errors"
	"github.com/aurora-billing/aurora/reconciler"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/config"
)

const accessLog = "../../shared/data/access-logs/elastic-apache_logs.log"

func testOptions(t *testing.T) Options {
	t.Helper()
	var ob config.Outbox
	if err := config.LoadFrom(&ob, map[string]string{"AURORA_OUTBOX_BACKOFF_BASE_SECONDS": "1", "AURORA_OUTBOX_BACKOFF_CAP_SECONDS": "2"}); err != nil {
		t.Fatal(err)
	}
	return Options{DatabaseURL: dbtest.AdminURL(), Account: "acct_demo_test", Outbox: ob, Timeout: 12 * time.Minute, Seed: 7}
}

// head writes the first n lines of the shared access log to a temp file.
func head(t *testing.T, n int) string {
	t.Helper()
	in, err := os.Open(accessLog)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	p := filepath.Join(t.TempDir(), "head.log")
	out, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	sc := bufio.NewScanner(in)
	for i := 0; i < n && sc.Scan(); i++ {
		out.WriteString(sc.Text() + "\n")
	}
	return p
}

func assertBalanced(t *testing.T, s *Summary) {
	t.Helper()
	if !s.Drained || s.ItemsByState["pending"] != 0 || s.ItemsByState["leased"] != 0 {
		t.Fatalf("not drained: %+v", s.ItemsByState)
	}
	if s.ProviderDuplicateApplications != 0 {
		t.Fatalf("%d identifiers applied twice", s.ProviderDuplicateApplications)
	}
	for f, q := range s.CommittedQuantity {
		if s.ProviderAppliedQuantity[f] != q {
			t.Fatalf("%s: committed %d, provider applied %d", f, q, s.ProviderAppliedQuantity[f])
		}
	}
	for _, st := range []string{"pending", "leased", "accepted", "confirmed", "uncertain", "rejected", "quarantined"} {
		if _, ok := s.ItemsByState[st]; !ok {
			t.Fatalf("items_by_state lacks %s", st)
		}
	}
}

// assertReconciledClean: the demo's reconciliation ran, compared windows,
// matched every one, and left no reconciliation item open (every kind
// reported, all 0).
func assertReconciledClean(t *testing.T, s *Summary) {
	t.Helper()
	r := s.Reconciliation
	if r == nil || r.WindowsCompared == 0 || r.WindowsMatched != r.WindowsCompared || r.WindowsUnsettled != 0 || r.ItemsConfirmed != s.ItemsStaged {
		t.Fatalf("reconciliation %+v, %d items staged", r, s.ItemsStaged)
	}
	if len(s.ReconciliationItems) != len(reconciler.Kinds) {
		t.Fatalf("reconciliation_items %v: want every kind", s.ReconciliationItems)
	}
	for k, n := range s.ReconciliationItems {
		if n != 0 {
			t.Fatalf("reconciliation_items %s = %d, want none open: %v", k, n, s.ReconciliationItems)
		}
	}
}

// Must show (issue 5): the shared access log, rebased: nothing pending or
// leased, applied = committed per feature, no identifier applied twice.
func TestDemoAccessLogRebased(t *testing.T) {
	t.Parallel()
	o := testOptions(t)
	o.Input, o.RebaseTime = accessLog, true
	s, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	assertBalanced(t, s)
	// Issue 14's must-show: every accepted item ends confirmed, on the
	// provider's own summaries, and no reconciliation item is open.
	if s.UsageEvents != 19331 || s.ItemsStaged != 19331 || s.Tenants != 1753 || s.ItemsByState["confirmed"] != 19331 || s.ItemsByState["accepted"] != 0 {
		t.Fatalf("%+v", s)
	}
	assertReconciledClean(t, s)
	if s.CommittedQuantity["api_calls"] != 10000 {
		t.Fatalf("api_calls committed %d, want one per request", s.CommittedQuantity["api_calls"])
	}
}

// Must show: the same under drop-after-apply, 500 and 429 faults.
func TestDemoWithFaults(t *testing.T) {
	t.Parallel()
	o := testOptions(t)
	o.Input, o.RebaseTime = head(t, 1500), true
	o.Faults = "drop-after-apply=0.1,http500=0.1,http429=0.1"
	s, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	assertBalanced(t, s)
	if s.ItemsByState["confirmed"] != s.ItemsStaged {
		t.Fatalf("%+v", s.ItemsByState)
	}
	assertReconciledClean(t, s)
	if s.ProviderRequests["dropped"] == 0 || s.ProviderRequests["server_error"] == 0 || s.ProviderRequests["rate_limited"] == 0 {
		t.Fatalf("faults not exercised: %v", s.ProviderRequests)
	}
}

// Must show: without --rebase-time the 2015 lines are quarantined
// timestamp_outside_window and nothing is sent for them.
func TestDemoOldLinesQuarantinedNotSent(t *testing.T) {
	t.Parallel()
	o := testOptions(t)
	o.Input = head(t, 500)
	s, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if s.ItemsByState["quarantined"] != s.ItemsStaged || s.QuarantinedByReason["timestamp_outside_window"] != s.ItemsStaged {
		t.Fatalf("%+v %+v", s.ItemsByState, s.QuarantinedByReason)
	}
	if s.ProviderRequests["applied"] != 0 || s.ProviderAppliedQuantity["api_calls"] != 0 {
		t.Fatalf("sent something: %v", s.ProviderRequests)
	}
}

func TestDemoMalformedLinesCountedNotStaged(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "mixed.log")
	now := time.Now().UTC().Format("02/Jan/2006:15:04:05 -0700")
	content := "1.2.3.4 - - [" + now + "] \"GET / HTTP/1.1\" 200 10 \"-\" \"x\"\nnot a log line\n\n5.6.7.8 - - [" + now + "] \"GET / HTTP/1.1\" 200 - \"-\" \"x\"\n"
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	o := testOptions(t)
	o.Input = p
	s, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if s.MalformedLines != 1 || len(s.FirstMalformed) != 1 || s.FirstMalformed[0].Line != 2 || s.ItemsStaged != 3 {
		t.Fatalf("%+v", s)
	}
	assertBalanced(t, s)
}

// A file with no usable line (all malformed, or empty) still runs and
// reports, and says so in its error (exit status 1).
func TestDemoNoUsableLines(t *testing.T) {
	t.Parallel()
	for name, content := range map[string]string{"garbage.log": "not a log line\nnor this\n", "empty.log": ""} {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		o := testOptions(t)
		o.Input = p
		s, err := Run(context.Background(), o)
		if !errors.Is(err, ErrNoUsage) || s == nil || s.ItemsStaged != 0 || !s.Drained {
			t.Fatalf("%s: %v %+v", name, err, s)
		}
		if name == "garbage.log" && (s.MalformedLines != 2 || len(s.FirstMalformed) != 2) {
			t.Fatalf("%s: malformed %d %+v", name, s.MalformedLines, s.FirstMalformed)
		}
	}
}

func TestDemoBadInputFile(t *testing.T) {
	t.Parallel()
	o := testOptions(t)
	o.Input = filepath.Join(t.TempDir(), "missing.log")
	if _, err := Run(context.Background(), o); err == nil {
		t.Fatal("missing input accepted")
	}
}

// Events the usage API refuses (a correction of an unknown event, an id
// reused with other content) are counted and reported, never staged, and
// never abort the run; the rest of their batch still goes out.
func TestDemoRefusedEventsAreCountedNotFatal(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC().Add(-time.Minute).Format(time.RFC3339)
	lines := []string{
		`{"tenant":"org_1","event_id":"e1","feature":"api_calls","quantity":3,"timestamp":"` + now + `"}`,
		`{"tenant":"org_1","event_id":"e2","feature":"api_calls","quantity":1,"timestamp":"` + now + `","corrects":"nope"}`,
		`{"tenant":"org_1","event_id":"e1","feature":"api_calls","quantity":4,"timestamp":"` + now + `"}`,
		`{"tenant":"org_2","event_id":"e3","feature":"api_calls","quantity":2,"timestamp":"` + now + `"}`,
	}
	p := filepath.Join(t.TempDir(), "usage.jsonl")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := testOptions(t)
	o.Input = p
	s, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if s.RejectedEvents != 2 || len(s.FirstRejected) != 2 || s.ItemsStaged != 2 || s.CommittedQuantity["api_calls"] != 5 {
		t.Fatalf("%+v", s)
	}
	assertBalanced(t, s)
}
