package sqlapi_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/internal/pipelinetest"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
)

// python returns an interpreter that imports psycopg: AURORA_TEST_PYTHON,
// else python3 on PATH, else /usr/bin/python3 (Debian's python3-psycopg,
// which .ci/run installs). The test fails, never skips, without one.
func python(t *testing.T) string {
	t.Helper()
	candidates := []string{os.Getenv("AURORA_TEST_PYTHON"), "python3", "/usr/bin/python3"}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if err := exec.Command(c, "-c", "import psycopg").Run(); err == nil {
			return c
		}
	}
	t.Fatal("no python3 with psycopg 3: install it (apt-get install python3-psycopg; .ci/run does) or set AURORA_TEST_PYTHON")
	return ""
}

type pythonReport struct {
	Committed struct {
		EventID        string `json:"event_id"`
		ItemID         int64  `json:"item_id"`
		IdempotencyKey string `json:"idempotency_key"`
		State          string `json:"state"`
		Created        bool   `json:"created"`
	} `json:"committed"`
	RolledBack struct {
		EventID string `json:"event_id"`
	} `json:"rolled_back"`
	BadCall struct {
		SQLState string `json:"sqlstate"`
		Column   string `json:"column"`
		Message  string `json:"message"`
	} `json:"bad_call"`
}

// TestPythonRecordsInItsOwnTransaction runs python/record_usage.py against
// a provisioned database with a running relay and deliverer: the committed
// order's usage is delivered to the provider exactly once under its key,
// the rolled-back twin left no order, no usage event and no item, and the
// bad call got AU001 naming the quantity.
func TestPythonRecordsInItsOwnTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	py := python(t)
	p := pipelinetest.New(t)
	p.Meter("api_calls")
	p.Customer("org_py")
	if err := pgx.BeginFunc(ctx, p.Pool, func(tx pgx.Tx) error {
		return usage.WriteSQLSettings(ctx, tx, usage.SQLSettings{DestinationAccount: pipelinetest.Account, Mode: identity.ModeTest,
			Period: usage.PeriodDay, Sources: usage.Sources{"api_calls": usage.SourceEvents}}, "test")
	}); err != nil {
		t.Fatal(err)
	}
	p.Start()
	script, err := filepath.Abs(filepath.Join("python", "record_usage.py"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, py, script, p.DatabaseURL)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, stderr.String())
	}
	var rep pythonReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	t.Logf("python: %s", strings.TrimSpace(string(out)))
	if !rep.Committed.Created || rep.Committed.State != "pending" {
		t.Fatalf("committed call: %+v", rep.Committed)
	}
	if rep.BadCall.SQLState != usage.SQLStateInvalidEvent || rep.BadCall.Column != "quantity" ||
		!strings.HasPrefix(rep.BadCall.Message, "usage: invalid quantity: must be >= 0") {
		t.Fatalf("bad call: %+v", rep.BadCall)
	}
	p.Settle()

	var state string
	var orders, events, items int
	if err := p.Pool.QueryRow(ctx, `SELECT state FROM outbox_items WHERE id = $1`, rep.Committed.ItemID).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if err := p.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM app_orders), (SELECT count(*) FROM usage_events), (SELECT count(*) FROM outbox_items)`).
		Scan(&orders, &events, &items); err != nil {
		t.Fatal(err)
	}
	if state != "accepted" || orders != 1 || events != 1 || items != 1 {
		t.Fatalf("after delivery: item %s, %d orders, %d usage events, %d items; want accepted, 1, 1, 1", state, orders, events, items)
	}
	if n := p.Emulator.Applications(rep.Committed.IdempotencyKey); n != 1 {
		t.Fatalf("the provider applied the committed usage %d times, want exactly once", n)
	}
	if got := p.Emulator.AppliedCount(); got != 1 {
		t.Fatalf("the provider applied %d events, want 1 (the rolled-back twin must never be sent)", got)
	}
	t.Logf("committed order-1 delivered once (key %s…); order-2 rolled back: 0 rows; bad call %s on %s: %s",
		rep.Committed.IdempotencyKey[:12], rep.BadCall.SQLState, rep.BadCall.Column, rep.BadCall.Message)
}
