package admin

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/gauge"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/outbox"
)

func TestStatusOnAQuietDatabase(t *testing.T) {
	env := map[string]string{"AURORA_DATABASE_URL": dbtest.NewDatabase(t)}
	code, out, errOut := runCtl(t, env, "status")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "nothing needs a person") || strings.Contains(out, "auroractl recovery") {
		t.Errorf("quiet database:\n%s", out)
	}
	code, out, _ = runCtl(t, env, "status", "--json")
	var got statusJSON
	if code != ExitOK || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("--json: exit %d\n%s", code, out)
	}
	for _, l := range got.Lines {
		if l.Value != 0 || l.Next != "" || l.Attention {
			t.Errorf("quiet database: %+v", l)
		}
	}
}

// Every figure that needs a person names its next command and runbook
// section; the others name none.
func TestStatusNamesTheNextCommandForEachNonZeroFigure(t *testing.T) {
	d := newRecoveryDB(t) // 2 uncertain, 1 quarantined feature_unmapped, 1 customer_missing
	code, out, errOut := runCtl(t, d.env, "status")
	if code != ExitAttention || !strings.Contains(errOut, "need a person") {
		t.Fatalf("exit %d (want %d, something needs a person): %s", code, ExitAttention, errOut)
	}
	for _, want := range []string{
		"outbox uncertain", "2", "auroractl recovery list --state uncertain", "[RUNBOOK.md: AuroraUncertainItems]",
		"quarantined feature_unmapped", "auroractl recovery list --state quarantined --reason customer_missing",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "nothing needs a person") {
		t.Errorf("status says nothing needs a person with uncertain items:\n%s", out)
	}
	code, out, _ = runCtl(t, d.env, "status", "--json")
	var got statusJSON
	if code != ExitAttention || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("--json: exit %d\n%s", code, out)
	}
	byFigure := map[string]StatusLine{}
	for _, l := range got.Lines {
		byFigure[l.Figure] = l
		if l.Attention != (l.Next != "") || (l.Attention && l.Value == 0) {
			t.Errorf("line %+v: a next command exactly when it needs attention, never for a zero", l)
		}
	}
	if l := byFigure["outbox uncertain"]; l.Value != 2 || l.Runbook != "AuroraUncertainItems" {
		t.Errorf("uncertain line %+v", l)
	}
	if l := byFigure["outbox quarantined"]; l.Value != 2 {
		t.Errorf("quarantined line %+v", l)
	}
	if got.Snapshot.Outbox.Items["uncertain"] != 2 {
		t.Errorf("snapshot %+v", got.Snapshot.Outbox)
	}
}

func TestStatusFailsWhenTheDatabaseCannotBeMeasured(t *testing.T) {
	env := map[string]string{"AURORA_DATABASE_URL": "postgres://postgres@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=2"}
	code, out, errOut := runCtl(t, env, "status")
	if code != ExitFailure || !strings.Contains(errOut, "cannot measure the database") || out != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// Which lines need a person: the backlog a running pipeline always has
// (young pending, leased, accepted items; inbox events being processed)
// does not; what only a person moves, and ages past the alert objectives, do.
func TestStatusLinesNeedAPersonOnlyPastTheirThreshold(t *testing.T) {
	healthy := func() gauge.Snapshot {
		return gauge.Snapshot{
			Outbox: gauge.Outbox{
				Items:             map[outbox.State]int64{outbox.StatePending: 40, outbox.StateLeased: 12},
				BacklogAgeSeconds: map[outbox.State]float64{outbox.StatePending: 3, outbox.StateLeased: 2, outbox.StateAccepted: 1800},
			},
			Inbox:  gauge.Inbox{Pending: 5, OldestPendingAgeSeconds: 1, HighestPendingAttempts: 1},
			Events: gauge.Events{ConsumerLagSeconds: map[string]float64{"ledger": 4, "mailer": 0}, ConsumerDeadLetters: map[string]int64{"ledger": 0}},
		}
	}
	for _, c := range []struct {
		name   string
		mutate func(*gauge.Snapshot)
		want   map[string]string // figure → runbook section of the lines needing a person
	}{
		{"healthy pipeline", func(*gauge.Snapshot) {}, map[string]string{}},
		{"old pending backlog", func(s *gauge.Snapshot) { s.Outbox.BacklogAgeSeconds[outbox.StatePending] = 901 },
			map[string]string{"outbox pending, oldest staged": "AuroraOutboxBacklogOld"}},
		{"accepted for three days", func(s *gauge.Snapshot) { s.Outbox.BacklogAgeSeconds[outbox.StateAccepted] = 3 * 86400 },
			map[string]string{"outbox accepted, oldest staged (awaiting confirmation)": "AuroraReconciliationItemOpenTooLong"}},
		{"inbox attempts at 3", func(s *gauge.Snapshot) { s.Inbox.HighestPendingAttempts = 3 },
			map[string]string{"inbox highest pending attempts": "AuroraInboxAttemptsGrowing"}},
		{"consumer dead letter", func(s *gauge.Snapshot) { s.Events.ConsumerDeadLetters["ledger"] = 1 },
			map[string]string{"domain event consumer dead letters": "AuroraEventDeadLetters", "  dead letters of consumer ledger": "AuroraEventDeadLetters"}},
		{"consumer lagging", func(s *gauge.Snapshot) { s.Events.ConsumerLagSeconds["mailer"] = 301 },
			map[string]string{"  catch-up lag of consumer mailer": "AuroraEventConsumerLagging"}},
		{"event outbox dead letter and dispatch behind", func(s *gauge.Snapshot) {
			s.Events.OutboxDeadLetters, s.Events.UndispatchedOldestAgeSeconds = 2, 121
		}, map[string]string{"domain events dead-lettered in the outbox": "AuroraEventDeadLetters", "domain events not yet dispatched, oldest": "AuroraEventDispatchBehind"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := healthy()
			c.mutate(&s)
			got := map[string]string{}
			for _, l := range StatusLines(s) {
				if l.Attention {
					got[l.Figure] = l.Runbook
					if l.Next == "" {
						t.Errorf("%q needs a person but names no next command", l.Figure)
					}
				} else if l.Next != "" || l.Runbook != "" {
					t.Errorf("%q needs nobody but names %q / %q", l.Figure, l.Next, l.Runbook)
				}
			}
			if len(got) != len(c.want) {
				t.Errorf("lines needing a person %v, want %v", got, c.want)
			}
			for f, rb := range c.want {
				if got[f] != rb {
					t.Errorf("%q: runbook %q, want %q (all: %v)", f, got[f], rb, got)
				}
			}
			var out strings.Builder
			if err := renderStatus(&out, s, StatusLines(s)); err != nil {
				t.Fatal(err)
			}
			if quiet := strings.Contains(out.String(), "nothing needs a person"); quiet != (len(c.want) == 0) {
				t.Errorf("\"nothing needs a person\" shown = %v with %d lines needing one:\n%s", quiet, len(c.want), out.String())
			}
		})
	}
}

func TestStatusAgeShowsNoneAndWholeSeconds(t *testing.T) {
	for in, want := range map[float64]string{0: "-", 0.4: "<1s", 1.6: "2s", 3725.2: "1h2m5s"} {
		if got := statusAge(in); got != want {
			t.Errorf("statusAge(%v) = %q, want %q", in, got, want)
		}
	}
}

// The exit code is a documented function of the lines: 0 when none needs a
// person, ExitAttention (6) when any does.
func TestStatusExitCodeSaysWhetherAPersonIsNeeded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines []StatusLine
		code  int
	}{
		{"none", nil, ExitOK},
		{"quiet", []StatusLine{{Figure: "outbox pending", Value: 40}}, ExitOK},
		{"one past its objective", []StatusLine{{Figure: "outbox pending", Value: 40}, {Figure: "inbox pending, oldest", Value: 7200, Attention: true}}, ExitAttention},
	} {
		err := attentionError(tc.lines)
		code := ExitOK
		var ee *ExitError
		if errors.As(err, &ee) {
			code = ee.Code
		} else if err != nil {
			code = -1
		}
		if code != tc.code {
			t.Errorf("%s: exit %d (%v), want %d", tc.name, code, err, tc.code)
		}
	}
	if ExitAttention != 6 {
		t.Fatalf("ExitAttention is %d; it is documented as 6", ExitAttention)
	}
}
