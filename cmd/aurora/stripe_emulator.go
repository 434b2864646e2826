package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/spf13/cobra"
)

// emulatorConfig is `aurora stripe-emulator`'s configuration (AURORA_*
// variables; flags of the same name override them).
type emulatorConfig struct {
	// Addr to listen on. AURORA_EMULATOR_ADDR, default 127.0.0.1:12112
	// (stripe-mock uses 12111).
	Addr string `env:"EMULATOR_ADDR" envDefault:"127.0.0.1:12112"`
	// Faults in stripeemulator.ParseFaults syntax, e.g.
	// "drop-after-apply=0.1,http500=0.1,http429=0.1,latency=20ms".
	// AURORA_EMULATOR_FAULTS, default none.
	Faults string `env:"EMULATOR_FAULTS"`
	// Seed of fault decisions and generated ids. AURORA_EMULATOR_SEED,
	// default 0.
	Seed uint64 `env:"EMULATOR_SEED" envDefault:"0"`
	// Keys accepted, comma-separated; "key:denied" authenticates but answers
	// 403. AURORA_EMULATOR_KEYS, default empty = any sk_test_/rk_test_/
	// sk_live_/rk_live_ key.
	Keys string `env:"EMULATOR_KEYS"`
	// Customers provisioned at start, comma-separated ids.
	// AURORA_EMULATOR_CUSTOMERS, default none.
	Customers string `env:"EMULATOR_CUSTOMERS"`
	// Meters created at start: comma-separated event names, each a sum
	// meter on payload keys stripe_customer_id and value.
	// AURORA_EMULATOR_METERS, default none.
	Meters string `env:"EMULATOR_METERS"`
	// AllowConcurrent turns off the one-call-per-(customer, meter) 429.
	// AURORA_EMULATOR_ALLOW_CONCURRENT, default false.
	AllowConcurrent bool `env:"EMULATOR_ALLOW_CONCURRENT" envDefault:"false"`
	// StateFile keeps meters, customers and applied events (for dedupe)
	// across restarts: loaded at start when it exists, written atomically
	// within a second of a change and at shutdown. AURORA_EMULATOR_STATE_FILE,
	// default none (state lives in memory only).
	StateFile string `env:"EMULATOR_STATE_FILE"`

	faults stripeemulator.Faults
	keys   map[string]stripeemulator.Access
}

// Validate checks the address, the fault specification and the key list;
// errors are *config.RangeError naming the variable.
func (c *emulatorConfig) Validate() error {
	if err := config.ListenAddr("EMULATOR_ADDR", c.Addr, false); err != nil {
		return err
	}
	f, err := stripeemulator.ParseFaults(c.Faults)
	if err != nil {
		var fe *stripeemulator.FaultSpecError
		reason := err.Error()
		if errors.As(err, &fe) {
			reason = fe.Item + ": " + fe.Reason
		}
		return &config.RangeError{Var: config.Prefix + "EMULATOR_FAULTS", Value: c.Faults,
			Allowed: "name=value items of latency (20ms or 10ms-50ms), http429, http500, http500-saved, drop-after-apply, cut-after-apply, timeout (rates 0..1, sum ≤ 1); " + reason}
	}
	c.faults = f
	c.keys = nil
	for _, item := range splitList(c.Keys) {
		key, access, _ := strings.Cut(item, ":")
		if c.keys == nil {
			c.keys = map[string]stripeemulator.Access{}
		}
		switch access {
		case "":
			c.keys[key] = stripeemulator.AccessFull
		case "denied":
			c.keys[key] = stripeemulator.AccessDenied
		default:
			return &config.RangeError{Var: config.Prefix + "EMULATOR_KEYS", Value: "(redacted)", Allowed: "comma-separated keys, each optionally suffixed :denied"}
		}
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func newStripeEmulatorCmd() *cobra.Command {
	var validate bool
	var flagAddr, flagFaults, flagCustomers, flagMeters, flagStateFile string
	var flagSeed uint64
	var flagAllowConcurrent bool
	cmd := &cobra.Command{
		Use:   "stripe-emulator",
		Short: "Serve a local Stripe meter-events emulator (dedupe, windows, idempotency, faults)",
		Long: `Serve the Stripe emulator (package stripeemulator) over HTTP.

Point stripe-go at it with BackendConfig.URL = http://<addr>. Meter events,
adjustments, summaries, meters and customers behave as documented in
docs/stripe-emulator.md. GET /_emulator/stats answers counts, applied totals,
duplicate applications and overlaps as JSON (no customer ids, no payloads).
GET /healthz answers 200 without an API key (the health check).

With --state-file (AURORA_EMULATOR_STATE_FILE) meters, customers and applied
events survive a restart: identifiers applied before it are still deduplicated.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var c emulatorConfig
			if err := config.Load(&c); err != nil {
				return err
			}
			f := cmd.Flags()
			if f.Changed("addr") {
				c.Addr = flagAddr
			}
			if f.Changed("faults") {
				c.Faults = flagFaults
			}
			if f.Changed("seed") {
				c.Seed = flagSeed
			}
			if f.Changed("customers") {
				c.Customers = flagCustomers
			}
			if f.Changed("meters") {
				c.Meters = flagMeters
			}
			if f.Changed("state-file") {
				c.StateFile = flagStateFile
			}
			if f.Changed("allow-concurrent") {
				c.AllowConcurrent = flagAllowConcurrent
			}
			if err := c.Validate(); err != nil {
				return err
			}
			if validate {
				fmt.Fprintf(cmd.OutOrStdout(), "configuration valid: addr=%s faults=%q seed=%d keys=%d customers=%d meters=%d allow_concurrent=%t\n",
					c.Addr, c.faults.String(), c.Seed, len(c.keys), len(splitList(c.Customers)), len(splitList(c.Meters)), c.AllowConcurrent)
				return nil
			}
			return runStripeEmulator(cmd.Context(), c, nil)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&validate, "validate", false, "check the configuration and exit")
	fl.StringVar(&flagAddr, "addr", "", "listen address (AURORA_EMULATOR_ADDR, default 127.0.0.1:12112)")
	fl.StringVar(&flagFaults, "faults", "", `faults, e.g. "drop-after-apply=0.1,http500=0.1,http429=0.1,latency=20ms" (AURORA_EMULATOR_FAULTS)`)
	fl.Uint64Var(&flagSeed, "seed", 0, "seed of fault decisions and generated ids (AURORA_EMULATOR_SEED)")
	fl.StringVar(&flagCustomers, "customers", "", "customer ids to provision, comma-separated (AURORA_EMULATOR_CUSTOMERS)")
	fl.StringVar(&flagMeters, "meters", "", "event names of sum meters to create, comma-separated (AURORA_EMULATOR_METERS)")
	fl.StringVar(&flagStateFile, "state-file", "", "keep meters, customers and applied events in this file across restarts (AURORA_EMULATOR_STATE_FILE)")
	fl.BoolVar(&flagAllowConcurrent, "allow-concurrent", false, "accept concurrent calls per (customer, meter) (AURORA_EMULATOR_ALLOW_CONCURRENT)")
	return cmd
}

// runStripeEmulator serves until ctx ends, then shuts down gracefully.
// ready, when not nil, is called with the emulator and the bound address
// once it accepts connections.
func runStripeEmulator(ctx context.Context, c emulatorConfig, ready func(*stripeemulator.Emulator, net.Addr)) error {
	emu, err := stripeemulator.New(stripeemulator.Config{Keys: c.keys, Faults: c.faults, Seed: c.Seed, AllowConcurrent: c.AllowConcurrent})
	if err != nil {
		return fmt.Errorf("%w: %w", config.ErrInvalid, err)
	}
	log := logger()
	if c.StateFile != "" {
		loaded, err := emu.LoadStateFile(c.StateFile)
		if err != nil {
			return fmt.Errorf("%w: AURORA_EMULATOR_STATE_FILE: %w", config.ErrInvalid, err)
		}
		st := emu.Stats()
		log.Info("stripe emulator state", "loaded", loaded, "meters", len(emu.Meters()), "applied", st.Applied)
	}
	for _, id := range splitList(c.Customers) {
		if err := emu.AddCustomer(id); err != nil {
			return fmt.Errorf("%w: AURORA_EMULATOR_CUSTOMERS: %w", config.ErrInvalid, err)
		}
	}
	for _, name := range splitList(c.Meters) {
		if hasActiveMeter(emu, name) { // kept in the state file
			continue
		}
		m, err := emu.AddMeter(stripeemulator.MeterSpec{DisplayName: name, EventName: name})
		if err != nil {
			return fmt.Errorf("%w: AURORA_EMULATOR_METERS: %w", config.ErrInvalid, err)
		}
		log.Info("stripe emulator meter", "event_name", m.EventName, "meter_id", m.ID)
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("stripe-emulator: listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("/", emu)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Info("stripe emulator listening", "addr", ln.Addr().String(), "faults", c.faults.String(),
		"customers", len(splitList(c.Customers)), "meters", len(splitList(c.Meters)))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	if ready != nil {
		ready(emu, ln.Addr())
	}
	var tick <-chan time.Time
	if c.StateFile != "" {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		tick = t.C
	}
	saved := emu.StateVersion()
	save := func() {
		v := emu.StateVersion()
		if err := emu.SaveStateFile(c.StateFile); err != nil {
			log.Error("stripe emulator state not saved", "err", err)
			return
		}
		saved = v
	}
	if c.StateFile != "" {
		save() // the meters and customers of the flags
	}
loop:
	for {
		select {
		case err := <-errc:
			return fmt.Errorf("stripe-emulator: serve: %w", err)
		case <-ctx.Done():
			break loop
		case <-tick:
			if emu.StateVersion() != saved {
				save()
			}
		}
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
	}
	if c.StateFile != "" {
		save()
	}
	st := emu.Stats()
	log.Info("stripe emulator stopped", "requests", st.Requests, "applied", st.Applied,
		"duplicate_applications", st.DuplicateApplications, "overlaps", st.Overlaps)
	return nil
}

// hasActiveMeter reports whether emu has an active meter for eventName.
func hasActiveMeter(emu *stripeemulator.Emulator, eventName string) bool {
	for _, m := range emu.Meters() {
		if m.Active && m.EventName == eventName {
			return true
		}
	}
	return false
}
