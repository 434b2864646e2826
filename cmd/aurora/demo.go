package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/demo"
	"github.com/aurora-billing/aurora/relay"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/spf13/cobra"
)

// demoConfig is what the demo reads from the environment. AURORA_NATS_URL,
// AURORA_STRIPE_API_KEY and AURORA_STRIPE_API_BASE have no defaults here:
// unset means "embed JetStream" and "use the emulator".
//
// The deliverers take every AURORA_DELIVERER_*, AURORA_STRIPE_TIMEOUT_SECONDS
// and AURORA_OUTBOX_* knob a deliverer service takes (deliverer.Config);
// the relay takes the AURORA_OUTBOX_* ones, and the stream the relay's
// stream knobs (AURORA_OUTBOX_PARTITIONS, AURORA_OUTBOX_STREAM_REPLICAS,
// AURORA_OUTBOX_DUPLICATE_WINDOW_SECONDS).
type demoConfig struct {
	config.Database
	deliverer.Config
	config.Export
	Stream relay.StreamConfig
	// BatchMessageItems: the relay's AURORA_RELAY_BATCH_MESSAGE_ITEMS.
	BatchMessageItems int    `env:"RELAY_BATCH_MESSAGE_ITEMS" envDefault:"1"`
	NATSURL           string `env:"NATS_URL"`
	StripeKey         string `env:"STRIPE_API_KEY"`
	StripeBase        string `env:"STRIPE_API_BASE"`
}

func (c *demoConfig) Validate() error {
	var nats error
	if c.NATSURL != "" {
		nats = config.NATS{URL: c.NATSURL}.Validate()
	}
	return errors.Join(c.Database.Validate(), c.Config.Validate(), c.Export.Validate(), c.Stream.Validate(), nats,
		config.IntRange("RELAY_BATCH_MESSAGE_ITEMS", c.BatchMessageItems, 1, 1000, "items"))
}

// demoGCPercent is the demo process's GOGC when the environment sets none.
const demoGCPercent = 400

func newDemoCmd() *cobra.Command {
	var (
		o          demo.Options
		asJSON     bool
		validate   bool
		cpuProfile string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole export pipeline on real usage and show the guarantees holding",
		Long: `Run the export pipeline end to end in one process: a fresh database on
AURORA_DATABASE_URL's server, an embedded JetStream (unless AURORA_NATS_URL is set), the
Stripe emulator (unless AURORA_STRIPE_API_KEY and AURORA_STRIPE_API_BASE are set), the relay
and several deliverers. Usage comes from --input (an Apache/nginx access log or JSONL) or a
deterministic generator. Prints a summary, or JSON with --json; logs go to stderr.

The demo shortens retry backoff to base 1 s, cap 10 s (a base set above 10 s is its own cap),
and runs the Go garbage collector at GOGC=400 unless GOGC is set (see BENCHMARKS.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg demoConfig
			env := environ()
			shortenBackoff(env)
			if err := config.LoadFrom(&cfg, env); err != nil {
				return err
			}
			if (cfg.StripeKey == "") != (cfg.StripeBase == "") {
				return usageError{errors.New("set both AURORA_STRIPE_API_KEY and AURORA_STRIPE_API_BASE to use a real Stripe, or neither to use the emulator")}
			}
			if cfg.StripeKey != "" && o.Faults != "" {
				return usageError{errors.New("--faults applies to the emulator only; unset AURORA_STRIPE_API_KEY to use it")}
			}
			if o.Exporter != "v1" && o.Exporter != "stream" {
				return usageError{errors.New("--exporter must be v1 or stream")}
			}
			if _, err := stripeemulator.ParseFaults(o.Faults); err != nil {
				return usageError{fmt.Errorf("--faults: %w", err)}
			}
			if o.Input != "" {
				if fi, err := os.Stat(o.Input); err != nil || fi.IsDir() {
					return usageError{fmt.Errorf("--input %s: not a readable file", o.Input)}
				}
			}
			if o.Deliverers < 1 || o.Deliverers > 32 {
				return usageError{fmt.Errorf("--deliverers must be 1..32, got %d", o.Deliverers)}
			}
			if o.GenTenants < 1 || o.GenTenants > 100000 {
				return usageError{fmt.Errorf("--tenants must be 1..100000, got %d", o.GenTenants)}
			}
			if o.GenRequests < 1 || o.GenRequests > 10000000 {
				return usageError{fmt.Errorf("--requests must be 1..10000000, got %d", o.GenRequests)}
			}
			if o.Timeout <= 0 {
				return usageError{fmt.Errorf("--timeout must be positive, got %s", o.Timeout)}
			}
			if cmd.Flags().Changed("input") && o.Input == "" {
				return usageError{errors.New("--input needs a file (leave the flag out to use the generator)")}
			}
			// The embedded JetStream is one server: a replicated stream
			// would only be refused once everything is set up.
			if cfg.NATSURL == "" && cfg.Stream.Replicas > 1 {
				return usageError{fmt.Errorf("AURORA_OUTBOX_STREAM_REPLICAS=%d needs a JetStream cluster; the demo's embedded JetStream is one server: set it to 1 or set AURORA_NATS_URL", cfg.Stream.Replicas)}
			}
			if cfg.StripeKey != "" {
				if err := (stripeexport.Config{APIKey: cfg.StripeKey, APIBase: cfg.StripeBase}).Validate(); err != nil {
					return err
				}
			}
			// The demo stages in the mode of the key it sends with (the
			// emulator's is a test key): a different AURORA_STRIPE_MODE would
			// only quarantine every item mode_mismatch.
			keyMode := identity.ModeTest
			if cfg.StripeKey != "" {
				keyMode = stripeexport.KeyMode(cfg.StripeKey)
			}
			if m := env["AURORA_STRIPE_MODE"]; m != "" && m != string(keyMode) {
				return usageError{fmt.Errorf("AURORA_STRIPE_MODE=%s does not match the Stripe key's mode (%s); the demo stages in the key's mode: unset it or set it to %s", m, keyMode, keyMode)}
			}
			if validate {
				fmt.Fprintln(cmd.OutOrStdout(), "configuration valid")
				return nil
			}
			o.DatabaseURL, o.NATSURL, o.StripeKey, o.StripeBase = cfg.Database.URL, cfg.NATSURL, cfg.StripeKey, cfg.StripeBase
			o.Account, o.Outbox, o.Deliverer = cfg.StripeAccount, cfg.Outbox, &cfg.Config
			o.Stream = &cfg.Stream
			o.RelayBatchMessageItems = cfg.BatchMessageItems
			o.Period = usage.Period(cfg.UsagePeriod)
			o.Logger = ops.NewLogger(os.Stderr, slog.LevelWarn)
			if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
				o.Progress = os.Stderr
			}
			// The demo process hosts the relay, every deliverer, JetStream
			// and the emulator, and nearly all it allocates is short-lived
			// (requests, rows, messages): a higher GC target trades memory
			// for CPU — measured on the shared access log, peak RSS 160 →
			// 340 MB and about 10 % less CPU in the process (BENCHMARKS.md).
			// The services keep Go's default; GOGC, when set, wins here too.
			if _, ok := os.LookupEnv("GOGC"); !ok {
				debug.SetGCPercent(demoGCPercent)
			}
			if cpuProfile != "" {
				stop, err := startCPUProfile(cpuProfile)
				if err != nil {
					return err
				}
				defer stop()
			}
			sum, err := demo.Run(cmd.Context(), o)
			if sum != nil {
				if asJSON {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					if err := enc.Encode(sum); err != nil {
						return err
					}
				} else {
					printSummary(cmd, sum, o.KeepDatabase)
				}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Input, "input", "", "usage input: an Apache/nginx access log or JSONL file (default: the built-in generator)")
	f.BoolVar(&o.RebaseTime, "rebase-time", false, "shift input timestamps so the newest lands in the last second of the previous hour (every hourly window ended, so the run's reconciliation can confirm it)")
	f.BoolVar(&o.SkipReconcile, "skip-reconcile", false, "end without the reconciliation run (items stay accepted, never confirmed)")
	f.BoolVar(&asJSON, "json", false, "print the summary as JSON (a stable contract)")
	f.StringVar(&o.Exporter, "exporter", "v1", "the demo account's exporter: v1 (one meter event call per item) or stream (Stripe's v2 meter event stream, batches of up to 100)")
	f.DurationVar(&o.SessionTTL, "emulator-session-ttl", 0, "the emulator's v2 session token lifetime (0 = 15m); short values expire tokens mid-run")
	f.StringVar(&o.Faults, "faults", "", "emulator faults, e.g. drop-after-apply=0.1,http500=0.1,http429=0.1,latency=20ms")
	f.IntVar(&o.Deliverers, "deliverers", 2, "deliverer instances (1..32)")
	f.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "give up waiting for the pipeline to drain after this long")
	f.BoolVar(&o.KeepDatabase, "keep-database", false, "keep the demo database (its name is in the summary) for inspection")
	f.Uint64Var(&o.Seed, "seed", 1, "seed of the generator and of the emulator's faults")
	f.IntVar(&o.GenTenants, "tenants", 50, "generator: tenants")
	f.IntVar(&o.GenRequests, "requests", 2000, "generator: requests")
	f.BoolVar(&validate, "validate", false, "check the configuration and exit")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (read it with go tool pprof)")
	return cmd
}

// startCPUProfile profiles the process's CPU into path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// Demo backoff when AURORA_OUTBOX_BACKOFF_* are not set, in seconds.
const (
	demoBackoffBase = 1
	demoBackoffCap  = 10
)

// shortenBackoff gives the demo its short retry backoff in env: each of
// AURORA_OUTBOX_BACKOFF_BASE_SECONDS and _CAP_SECONDS not set gets the
// demo's value, kept consistent with the one that is set (a base above the
// demo's cap is its own cap; a cap below the demo's base is its own base),
// so setting one never makes the other out of range. Values that do not
// parse are left for the configuration check to name.
func shortenBackoff(env map[string]string) {
	const baseVar, capVar = "AURORA_OUTBOX_BACKOFF_BASE_SECONDS", "AURORA_OUTBOX_BACKOFF_CAP_SECONDS"
	base, cap_ := env[baseVar], env[capVar]
	baseSet, capSet := base != "", cap_ != "" // empty counts as unset, as for every variable
	switch {
	case !baseSet && !capSet:
		env[baseVar], env[capVar] = strconv.Itoa(demoBackoffBase), strconv.Itoa(demoBackoffCap)
	case !capSet:
		c := demoBackoffCap
		if b, err := strconv.Atoi(strings.TrimSpace(base)); err == nil && b > c {
			c = b
		}
		env[capVar] = strconv.Itoa(c)
	case !baseSet:
		b := demoBackoffBase
		if c, err := strconv.Atoi(strings.TrimSpace(cap_)); err == nil && c >= 1 && c < b {
			b = c
		}
		env[baseVar] = strconv.Itoa(b)
	}
}

func environ() map[string]string {
	m := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

func printSummary(cmd *cobra.Command, s *demo.Summary, kept bool) {
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "aurora demo — input %s, provider %s, exporter %s", s.Input, s.Provider, s.Exporter)
	if s.Faults != "" {
		fmt.Fprintf(w, " (faults %s)", s.Faults)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  usage events      %d read from %d tenants (%d malformed lines skipped; %d of the events refused by the usage API, not staged)\n", s.UsageEvents, s.Tenants, s.MalformedLines, s.RejectedEvents)
	for _, m := range s.FirstMalformed {
		fmt.Fprintf(w, "    line %d: %s\n", m.Line, m.Reason)
	}
	for _, r := range s.FirstRejected {
		fmt.Fprintf(w, "    line %d, event %s: %s\n", r.Line, r.EventID, r.Reason)
	}
	if s.Drained {
		fmt.Fprintf(w, "  items staged      %d; staged to resolved in %.1fs (%.0f items/s), drained=true\n", s.ItemsStaged, s.ElapsedSeconds, s.ItemsPerSecond)
	} else {
		open := s.ItemsByState["pending"] + s.ItemsByState["leased"]
		fmt.Fprintf(w, "  items staged      %d; NOT drained: %d still pending or leased after %.1fs, drained=false\n", s.ItemsStaged, open, s.ElapsedSeconds)
	}
	fmt.Fprint(w, "  items by state   ")
	for _, st := range []string{"pending", "leased", "accepted", "confirmed", "uncertain", "rejected", "quarantined"} {
		fmt.Fprintf(w, " %s=%d", st, s.ItemsByState[st])
	}
	fmt.Fprintln(w)
	reasons := make([]string, 0, len(s.QuarantinedByReason))
	for r := range s.QuarantinedByReason {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		fmt.Fprintf(w, "    quarantined %s: %d\n", r, s.QuarantinedByReason[r])
	}
	feats := make([]string, 0, len(s.CommittedQuantity))
	for f := range s.CommittedQuantity {
		feats = append(feats, f)
	}
	sort.Strings(feats)
	for _, f := range feats {
		match := "n/a"
		if p, ok := s.ProviderAppliedQuantity[f]; ok {
			match = fmt.Sprintf("%d", p)
			if p == s.CommittedQuantity[f] {
				match += " ✓"
			} else {
				match += " ✗ MISMATCH"
			}
		}
		fmt.Fprintf(w, "  %-16s committed %d, provider applied %s\n", f, s.CommittedQuantity[f], match)
	}
	fmt.Fprintf(w, "  identifiers applied more than once at the provider: %d\n", s.ProviderDuplicateApplications)
	if r := s.Reconciliation; r != nil {
		fmt.Fprintf(w, "  reconciliation    %d windows compared, %d matched, %d unsettled; %d items confirmed\n",
			r.WindowsCompared, r.WindowsMatched, r.WindowsUnsettled, r.ItemsConfirmed)
		kinds := make([]string, 0, len(s.ReconciliationItems))
		open := 0
		for k, n := range s.ReconciliationItems {
			if n != 0 {
				kinds = append(kinds, k)
				open += n
			}
		}
		sort.Strings(kinds)
		fmt.Fprintf(w, "  open findings     %d", open)
		for _, k := range kinds {
			fmt.Fprintf(w, " %s=%d", k, s.ReconciliationItems[k])
		}
		if open != 0 {
			fmt.Fprint(w, "   (auroractl reconcile list, with --keep-database)")
		}
		fmt.Fprintln(w)
	}
	if kept {
		fmt.Fprintf(w, "  database          %s (kept: drop it with DROP DATABASE when done)\n", s.Database)
	}
}
