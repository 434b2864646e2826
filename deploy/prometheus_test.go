package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/admin"
	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/gauge"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/provision"
	"github.com/aurora-billing/aurora/relay"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	account = "acct_1Prom"
	tenant  = "org_prom"
	feature = "api_calls"
)

// serve serves h on a random loopback port until the test ends and returns
// host:port.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // closed at cleanup
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// freePort returns a loopback port nobody listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// promServer is a real Prometheus server (the Debian package's binary) on
// loopback, its data in a temp dir, stopped when the test ends.
type promServer struct {
	t    *testing.T
	base string
	logs *bytes.Buffer
}

func startPrometheus(t *testing.T, targets map[string]string) *promServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus not on PATH: install Debian's prometheus package (apt-get install prometheus); .ci/run does")
	}
	rules, err := filepath.Abs("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\nrule_files:\n  - %q\nscrape_configs:\n", rules)
	for job, addr := range targets {
		fmt.Fprintf(&cfg, "  - job_name: %s\n    static_configs:\n      - targets: [%q]\n", job, addr)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	logs := &bytes.Buffer{}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("prometheus log:\n%s", logs.String())
		}
	})
	p := &promServer{t: t, base: "http://" + addr, logs: logs}
	p.await("prometheus ready", 30*time.Second, func() bool {
		resp, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

func (p *promServer) await(what string, within time.Duration, cond func() bool) {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// api GETs path with query params and decodes data into out; it returns
// Prometheus's error text for a non-success answer.
func (p *promServer) api(path string, params url.Values, out any) error {
	resp, err := http.Get(p.base + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("%s: %d %s", path, resp.StatusCode, body)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", path, env.Error)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(env.Data, out)
}

type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query evaluates expr now and returns the instant vector.
func (p *promServer) query(expr string) ([]sample, error) {
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.api("/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, nil // a scalar or string answer evaluated fine
	}
	var v []sample
	return v, json.Unmarshal(data.Result, &v)
}

// alertState returns the state of alertname ("" when inactive).
func (p *promServer) alertState(alertname string) string {
	p.t.Helper()
	var data struct {
		Alerts []struct {
			Labels map[string]string `json:"labels"`
			State  string            `json:"state"`
		} `json:"alerts"`
	}
	if err := p.api("/api/v1/alerts", nil, &data); err != nil {
		p.t.Fatal(err)
	}
	for _, a := range data.Alerts {
		if a.Labels["alertname"] == alertname {
			return a.State
		}
	}
	return ""
}

// up returns the value of up for job ("" when no sample).
func (p *promServer) up(job string) string {
	v, err := p.query(`up{job="` + job + `"}`)
	if err != nil || len(v) != 1 {
		return ""
	}
	s, _ := v[0].Value[1].(string)
	return s
}

// pipeline is the export pipeline running in this process: Postgres, an
// embedded JetStream, the Stripe emulator, a relay, a deliverer and the
// gauges exporter, each with its own /metrics on loopback.
type pipeline struct {
	dbURL   string
	pool    *pgxpool.Pool
	emu     *stripeemulator.Emulator
	targets map[string]string
	cutDB   func() // the gauges exporter loses its database
}

func startPipeline(t *testing.T) *pipeline {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	p := &pipeline{dbURL: dbtest.NewDatabase(t), targets: map[string]string{}}
	var err error
	if p.pool, err = pgxpool.New(ctx, p.dbURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.pool.Close)

	if p.emu, err = stripeemulator.New(stripeemulator.Config{}); err != nil {
		t.Fatal(err)
	}
	emuBase := "http://" + serve(t, p.emu)
	const key = "sk_test_prometheus"
	api := provision.NewAPI(key, emuBase, nil)
	if err := provision.Account(ctx, p.pool, account, identity.ModeTest, true); err != nil {
		t.Fatal(err)
	}
	if _, err := provision.Meter(ctx, p.pool, api, account, feature, "aurora_"+feature); err != nil {
		t.Fatal(err)
	}
	if _, _, err := provision.Customer(ctx, p.pool, api, account, tenant); err != nil {
		t.Fatal(err)
	}

	nc, err := nats.Connect(natstest.New(t).URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	run := func(name string, fn func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("%s: %v", name, err)
			}
		}()
	}

	// Two attempts, one second apart: an item the emulator answers 500
	// twice is uncertain within seconds (retries exhausted).
	outboxCfg := relay.DefaultConfig().Outbox
	outboxCfg.MaxAttempts, outboxCfg.BackoffBaseSeconds, outboxCfg.BackoffCapSeconds = 2, 1, 1

	relayReg := prometheus.NewRegistry()
	rcfg := relay.DefaultConfig()
	rcfg.Outbox, rcfg.PollMS = outboxCfg, 100
	if _, err := relay.EnsureStream(ctx, js, rcfg.Stream); err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(p.pool, js, rcfg, relay.WithRegistry(relayReg))
	if err != nil {
		t.Fatal(err)
	}
	run("relay", rl.Run)
	p.targets["aurora-relay"] = serve(t, ops.Handler(relayReg))

	delivReg := prometheus.NewRegistry()
	dcfg := deliverer.DefaultConfig()
	dcfg.Outbox = outboxCfg
	exp, err := stripeexport.New(stripeexport.Config{APIKey: key, APIBase: emuBase}, time.Duration(dcfg.ProviderTimeoutSeconds)*time.Second, dcfg.Concurrency)
	if err != nil {
		t.Fatal(err)
	}
	d, err := deliverer.New(p.pool, js, exp, dcfg, deliverer.WithRegisterer(delivReg))
	if err != nil {
		t.Fatal(err)
	}
	run("deliverer", d.Run)
	p.targets["aurora-deliverer"] = serve(t, ops.Handler(delivReg))

	// The gauges exporter reaches Postgres through a proxy the test can cut.
	u, err := url.Parse(p.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, u.Host)
	u.Host = px.Addr()
	gcfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	gcfg.ConnConfig.ConnectTimeout = 500 * time.Millisecond
	gpool, err := pgxpool.NewWithConfig(ctx, gcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gpool.Close)
	cfg := gauge.DefaultConfig()
	cfg.MinIntervalMS, cfg.QueryTimeoutMS = 0, 800
	r, err := gauge.NewReader(gpool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	gaugesReg := prometheus.NewRegistry()
	gaugesReg.MustRegister(gauge.NewCollector(r, nil))
	p.targets["aurora-gauges"] = serve(t, ops.Handler(gaugesReg))
	p.cutDB = px.Cut
	// Registered last so it runs first: the services stop before the
	// connections, JetStream and the database they use.
	t.Cleanup(func() { cancel(); wg.Wait() })
	return p
}

// stageFailing records one usage event whose every send the emulator
// answers 500, scripting the answers before the row commits so the first
// attempt already gets one.
func (p *pipeline) stageFailing(t *testing.T) outbox.Row {
	t.Helper()
	ctx := context.Background()
	rec := usage.Recorder{DestinationAccount: account, Mode: identity.ModeTest, Period: usage.PeriodDay}
	var row outbox.Row
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		var err error
		row, _, err = rec.Record(ctx, tx, usage.Event{Tenant: tenant, EventID: "req-prom-1", Feature: feature, Quantity: 3, OccurredAt: time.Now().Add(-time.Minute)})
		if err != nil {
			return err
		}
		answers, err := stripeemulator.ParseAnswers("500,500")
		if err != nil {
			return err
		}
		p.emu.Script(row.IdempotencyKey, answers...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return row
}

func (p *pipeline) state(t *testing.T, id int64) outbox.State {
	t.Helper()
	var s string
	if err := p.pool.QueryRow(context.Background(), `SELECT state FROM outbox_items WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return outbox.State(s)
}

// The must-show: a real Prometheus scraping a running pipeline sees
// AuroraUncertainItems go pending and then firing for an item the emulator
// made uncertain (retries exhausted), and clear after `auroractl recovery
// acknowledge --yes`; every rule and every dashboard expression evaluates
// without error; and when the gauges exporter loses Postgres its scrape
// fails (up == 0) and the backlog gauge has no sample rather than a zero.
func TestAlertsAgainstARealPrometheus(t *testing.T) {
	if _, err := exec.LookPath("prometheus"); err != nil {
		t.Skip("prometheus not on PATH: install Debian's prometheus package (apt-get install prometheus); .ci/run does")
	}
	pl := startPipeline(t)
	prom := startPrometheus(t, pl.targets)
	for job := range pl.targets {
		prom.await(job+" up", 30*time.Second, func() bool { return prom.up(job) == "1" })
	}

	// Every rule loaded and evaluates cleanly.
	var rules struct {
		Groups []struct {
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	prom.await("every rule evaluated", 20*time.Second, func() bool {
		if err := prom.api("/api/v1/rules", nil, &rules); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				if r.Health == "ok" {
					n++
				}
			}
		}
		return n == len(alerts(t))
	})
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Health != "ok" || r.LastError != "" {
				t.Errorf("rule %s: health %q, error %q", r.Name, r.Health, r.LastError)
			}
		}
	}

	// Every dashboard expression evaluates on this server.
	for _, e := range dashboardExprs(t) {
		if _, err := prom.query(grafanaVars.Replace(e.expr)); err != nil {
			t.Errorf("dashboard panel %q: %s: %v", e.panel, e.expr, err)
		}
	}

	if s := prom.alertState("AuroraUncertainItems"); s != "" {
		t.Fatalf("AuroraUncertainItems is %q before anything is uncertain", s)
	}
	began := time.Now()
	row := pl.stageFailing(t)
	prom.await("the item uncertain (retries exhausted)", 60*time.Second, func() bool {
		return pl.state(t, row.ID) == outbox.StateUncertain
	})
	t.Logf("item %d uncertain after %s (two 500s, max attempts 2)", row.ID, time.Since(began).Round(time.Millisecond))
	prom.await("AuroraUncertainItems pending", 30*time.Second, func() bool {
		return prom.alertState("AuroraUncertainItems") == "pending"
	})
	t.Logf("AuroraUncertainItems pending after %s", time.Since(began).Round(time.Millisecond))
	prom.await("AuroraUncertainItems firing (for: 1m)", 90*time.Second, func() bool {
		return prom.alertState("AuroraUncertainItems") == "firing"
	})
	t.Logf("AuroraUncertainItems firing after %s", time.Since(began).Round(time.Millisecond))

	// The operator resolves it, as RUNBOOK.md says, with auroractl.
	t.Setenv("AURORA_DATABASE_URL", pl.dbURL)
	var out, errOut bytes.Buffer
	code := admin.Main(context.Background(), []string{"recovery", "acknowledge", fmt.Sprint(row.ID),
		"--provider-ref", "req_prom_test", "--reason", "verified in the emulator's request log",
		"--evidence", "the emulator applied no event for this identifier; test acknowledges to clear the alert",
		"--actor", "prometheus-test", "--yes"}, admin.IO{Out: &out, Err: &errOut})
	if code != admin.ExitOK {
		t.Fatalf("auroractl recovery acknowledge: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	if s := pl.state(t, row.ID); s != outbox.StateAccepted {
		t.Fatalf("after acknowledge: %s, want accepted", s)
	}
	acked := time.Now()
	prom.await("AuroraUncertainItems cleared", 30*time.Second, func() bool {
		return prom.alertState("AuroraUncertainItems") == ""
	})
	t.Logf("AuroraUncertainItems cleared %s after auroractl recovery acknowledge --yes", time.Since(acked).Round(time.Millisecond))

	// Postgres gone under the exporter: up == 0, and no backlog sample at
	// all (never a zero).
	pl.cutDB()
	cut := time.Now()
	prom.await("aurora-gauges up == 0", 30*time.Second, func() bool { return prom.up("aurora-gauges") == "0" })
	t.Logf("database cut: aurora-gauges up == 0 after %s", time.Since(cut).Round(time.Millisecond))
	v, err := prom.query(`aurora_db_outbox_backlog_age_seconds`)
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 0 {
		t.Errorf("after failed scrapes the backlog gauge still answers %v, want no sample", v)
	}
	if up := prom.up("aurora-relay"); up != "1" {
		t.Errorf("relay up = %q: losing the gauges' database must not look like the relay down", up)
	}
}
