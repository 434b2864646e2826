package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"github.com/aurora-billing/aurora/internal/syncbuf"
	"log/slog"
	"os"
	"strings"
	"testing"
)

// rawHosts returns the client hosts of an access log (the first field of
// each line): the demo turns each into an anonymised tenant, so none may
// reach the logs.
func rawHosts(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hosts := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if host, _, ok := strings.Cut(sc.Text(), " "); ok && host != "" && host != "-" {
			hosts[host] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return hosts
}

// A full demo run over the shared access log, with faults so the retry,
// drop and rate-limit paths log too, at debug level: every line is JSON,
// and none carries a Stripe customer id, an API key, a webhook secret or a
// tenant's raw host.
func TestDemoLogsCarryNoSecretsOrPersonalData(t *testing.T) {
	t.Parallel()
	logs := &syncbuf.Buffer{}
	o := testOptions(t)
	input := accessLog
	if p := os.Getenv("AURORA_TEST_ACCESS_LOG"); p != "" {
		input = p // a checkout that does not sit next to the shared data folder
	}
	o.Input, o.RebaseTime = input, true
	o.Faults = "drop-after-apply=0.05,http500=0.05,http429=0.05"
	o.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if s.ProviderRequests["dropped"] == 0 || s.ProviderRequests["server_error"] == 0 || s.ProviderRequests["rate_limited"] == 0 {
		t.Fatalf("faults not exercised: %v", s.ProviderRequests)
	}
	out := logs.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 10 {
		t.Fatalf("only %d log lines: the run logged nothing to check", len(lines))
	}
	for i, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Fatalf("log line %d is not JSON: %q", i+1, l)
		}
	}
	for _, secret := range []string{"cus_", "sk_", "rk_", "whsec_"} {
		if i := strings.Index(out, secret); i >= 0 {
			t.Errorf("logs carry %q: …%s…", secret, out[max(0, i-80):min(len(out), i+80)])
		}
	}
	hosts := rawHosts(t, input)
	leaked := 0
	for h := range hosts {
		if strings.Contains(out, h) {
			leaked++
			if leaked <= 5 {
				t.Errorf("logs carry the raw host %q", h)
			}
		}
	}
	t.Logf("%d JSON log lines, %d raw hosts checked, %d items, requests %v", len(lines), len(hosts), s.ItemsStaged, s.ProviderRequests)
}
