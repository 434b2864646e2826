package admin

import (
	"context"
	"encoding/json"
	"maps"
	neturl "net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/demo"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const sharedAccessLog = "../../shared/data/access-logs/elastic-apache_logs.log"

// quantities returns sum(quantity) per "tenant/feature" of the items of
// url in the given states (every state when none is given).
func quantities(t *testing.T, url string, states ...string) map[string]int64 {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.Query(context.Background(),
		`SELECT tenant || '/' || feature, sum(quantity)::bigint FROM outbox_items
		 WHERE coalesce(cardinality($1::text[]), 0) = 0 OR state = ANY($1) GROUP BY 1`, states)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kv [2]any, err error) {
		var k string
		var v int64
		err = r.Scan(&k, &v)
		return [2]any{k, v}, err
	})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	for _, kv := range out {
		m[kv[0].(string)] = kv[1].(int64)
	}
	return m
}

// `usage import` of the shared access log records exactly what the demo
// commits for it: the same totals per tenant and feature (the demo's
// accepted and confirmed items, after delivery to the emulator, against
// the imported items) and the same event count.
func TestUsageImportAccessLogEqualsDemo(t *testing.T) {
	if raceEnabled {
		// 19,331 items through the whole pipeline took over 4 minutes
		// under the race detector on a shared machine; without it ~3.
		t.Skip("the full demo run is too slow under -race: run go test -run TestUsageImportAccessLogEqualsDemo ./admin/ without it")
	}
	input := sharedAccessLog
	if p := os.Getenv("AURORA_TEST_ACCESS_LOG"); p != "" {
		input = p
	}
	var ob config.Outbox
	if err := config.LoadFrom(&ob, map[string]string{"AURORA_OUTBOX_BACKOFF_BASE_SECONDS": "1", "AURORA_OUTBOX_BACKOFF_CAP_SECONDS": "2"}); err != nil {
		t.Fatal(err)
	}
	sum, err := demo.Run(context.Background(), demo.Options{DatabaseURL: dbtest.AdminURL(), Account: "acct_import_demo", Outbox: ob,
		Timeout: 4 * time.Minute, Seed: 7, Input: input, RebaseTime: true, KeepDatabase: true})
	if sum != nil && sum.Database != "" {
		t.Cleanup(func() {
			c, err := pgx.Connect(context.Background(), dbtest.AdminURL())
			if err == nil {
				_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{sum.Database}.Sanitize()+" WITH (FORCE)")
				c.Close(context.Background())
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	if !sum.Drained || sum.ItemsByState["quarantined"] != 0 || sum.RejectedEvents != 0 {
		t.Fatalf("demo run: drained=%v states %v rejected %d", sum.Drained, sum.ItemsByState, sum.RejectedEvents)
	}
	u, err := neturl.Parse(dbtest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + sum.Database
	demoCommitted := quantities(t, u.String(), "accepted", "confirmed")
	perFeature := map[string]int64{}
	for k, v := range demoCommitted {
		perFeature[k[strings.IndexByte(k, '/')+1:]] += v
	}
	if !maps.Equal(perFeature, sum.CommittedQuantity) {
		t.Fatalf("demo's database %v, its summary %v", perFeature, sum.CommittedQuantity)
	}

	url := dbtest.NewDatabase(t)
	env := map[string]string{"AURORA_DATABASE_URL": url, "AURORA_STRIPE_ACCOUNT": "acct_import_demo", "AURORA_FEATURE_SOURCES": "api_calls:events,egress_bytes:events"}
	code, out, errOut := runCtl(t, env, "usage", "import", input, "--rebase-time", "--json")
	if code != 0 || errOut != "" {
		t.Fatalf("import: %d %q %q", code, out, errOut)
	}
	var got ImportSummary
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.UsageEvents != sum.UsageEvents || got.Recorded != sum.ItemsStaged || got.Tenants != sum.Tenants || got.MalformedLines != sum.MalformedLines {
		t.Fatalf("import %+v, demo events %d items %d tenants %d malformed %d", got, sum.UsageEvents, sum.ItemsStaged, sum.Tenants, sum.MalformedLines)
	}
	imported := quantities(t, url)
	if !maps.Equal(imported, demoCommitted) {
		keys := slices.Sorted(maps.Keys(demoCommitted))
		for _, k := range keys {
			if imported[k] != demoCommitted[k] {
				t.Errorf("%s: imported %d, demo committed %d", k, imported[k], demoCommitted[k])
			}
		}
		t.Fatalf("imported %d tenant/feature totals, demo %d", len(imported), len(demoCommitted))
	}
	t.Logf("%d tenant/feature totals equal; per feature %v", len(imported), sum.CommittedQuantity)

}

// The demo's hostile JSONL: every good line recorded once, each malformed
// line and refused event reported with its line number as the demo does,
// the exit status 2; importing again records nothing new.
func TestUsageImportHostileJSONL(t *testing.T) {
	url := dbtest.NewDatabase(t)
	env := map[string]string{"AURORA_DATABASE_URL": url, "AURORA_STRIPE_ACCOUNT": "acct_import", "AURORA_FEATURE_SOURCES": "api_calls:events,egress_bytes:events"}
	for run := range 2 {
		code, out, errOut := runCtl(t, env, "usage", "import", "../demo/testdata/hostile.jsonl", "--json")
		if code != ExitInvalidInput || !strings.Contains(errOut, "10 malformed lines and 2 refused events") {
			t.Fatalf("run %d: %d %q", run, code, errOut)
		}
		var s ImportSummary
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatal(err)
		}
		var lines []int
		for _, m := range s.FirstMalformed {
			lines = append(lines, m.Line)
		}
		if !slices.Equal(lines, []int{2, 3, 4, 5, 7, 8, 9, 10, 11, 15}) || s.Format != "jsonl" {
			t.Fatalf("run %d: malformed %v format %s", run, lines, s.Format)
		}
		if s.RefusedEvents != 2 || s.FirstRefused[0].Line != 13 || !strings.Contains(s.FirstRefused[0].Reason, "event_conflict") ||
			s.FirstRefused[1].Line != 14 || !strings.Contains(s.FirstRefused[1].Reason, "corrected_event_unknown") {
			t.Fatalf("run %d: refused %+v", run, s.FirstRefused)
		}
		if wantNew := []int{4, 0}[run]; s.Recorded != wantNew || s.AlreadyPresent != 4-wantNew {
			t.Fatalf("run %d: recorded %d already %d", run, s.Recorded, s.AlreadyPresent)
		}
	}
	want := map[string]int64{"org_a/api_calls": 3, "org_b/egress_bytes": 5, "org_b/api_calls": 999_999_999_999_999, "org_c/api_calls": 7}
	if got := quantities(t, url); !maps.Equal(got, want) {
		t.Fatalf("items %v, want %v", got, want)
	}
	// The text report is the demo's.
	_, out, _ := runCtl(t, env, "usage", "import", "../demo/testdata/hostile.jsonl")
	if !strings.Contains(out, "usage events      6 from 3 tenants (10 malformed lines, 2 events refused)") ||
		!strings.Contains(out, "    line 2: ") || !strings.Contains(out, "    line 13, event good-1: ") {
		t.Fatalf("text report %q", out)
	}
	// Not a terminal: no progress on stderr.
	_, _, errOut := runCtl(t, env, "usage", "import", "../demo/testdata/hostile.jsonl")
	if strings.Contains(errOut, "events recorded") {
		t.Fatalf("progress written to a non-terminal: %q", errOut)
	}
}

func TestUsageImportBadInput(t *testing.T) {
	url := dbtest.NewDatabase(t)
	env := map[string]string{"AURORA_DATABASE_URL": url}
	empty := t.TempDir() + "/empty.jsonl"
	if err := os.WriteFile(empty, []byte("\n{\"x\":1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"usage", "import", t.TempDir() + "/missing.log"}, ExitNotFound, "cannot open"},
		{[]string{"usage", "import", empty}, ExitInvalidInput, "no usable usage lines"},
		{[]string{"usage", "import", empty, "--format", "csv"}, ExitInvalidInput, "--format"},
		{[]string{"usage", "import"}, ExitInvalidInput, "accepts 1 arg"},
	} {
		code, _, errOut := runCtl(t, env, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.msg) {
			t.Errorf("%v: %d %q", tc.args, code, errOut)
		}
	}
}
