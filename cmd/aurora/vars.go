package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"sort"
	"strings"

	"github.com/aurora-billing/aurora/admin"
	"github.com/aurora-billing/aurora/inbox"
	"github.com/aurora-billing/aurora/reconciler"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/events"
	"github.com/spf13/cobra"
)

// serviceConfigs maps each subcommand that reads AURORA_* variables to the
// configuration struct it loads: the one place that says which service
// reads which variable. The README's variable table is rendered from it
// (TestREADMEVariableTable), --validate lists a service's variables from
// it, and a variable no entry reads is warned about at start. A new
// service adds its line here.
func serviceConfigs() map[string]config.Validator {
	return map[string]config.Validator{
		"relay":           &relayConfig{},
		"deliverer":       &delivererConfig{},
		"reporter":        &reporterConfig{},
		"inbox":           &inbox.Config{},
		"reconciler":      &reconciler.Config{},
		"gauges":          &gaugesConfig{},
		"stripe-emulator": &emulatorConfig{},
		"demo":            &demoConfig{},
		"migrate":         &config.Database{},
	}
}

// otherReaders are the readers of AURORA_* variables outside the services:
// auroractl, a domain-event consumer (an application's, or the example
// ledger-example: shared/events' consumer knobs, and the stream's, which
// it ensures), and the tests.
func otherReaders() map[string][]string {
	return map[string][]string{
		"auroractl": admin.EnvVars(),
		"events consumer": append(config.Names(&events.ConsumerConfig{}),
			"AURORA_EVENTS_STREAM_REPLICAS", "AURORA_EVENTS_STREAM_MAX_AGE_HOURS", "AURORA_EVENTS_DUPLICATE_WINDOW_SECONDS"),
		"tests": {"AURORA_TEST_DATABASE_URL", "AURORA_TEST_PYTHON"},
	}
}

// readers returns, for every known variable, the sorted names of what
// reads it.
func readers() map[string][]string {
	out := map[string][]string{}
	for svc, cfg := range serviceConfigs() {
		for _, n := range config.Names(cfg) {
			out[n] = append(out[n], svc)
		}
	}
	for who, names := range otherReaders() {
		for _, n := range names {
			out[n] = append(out[n], who)
		}
	}
	for n := range out {
		sort.Strings(out[n])
	}
	return out
}

func knownVars() []string {
	r := readers()
	out := make([]string, 0, len(r))
	for n := range r {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// warnUnknownVars logs one warning per AURORA_* variable in the
// environment that nothing in aurora reads, naming the closest known one
// (a misspelt AURORA_RELAY_WORKRS=3 would otherwise be ignored silently).
// Values are never logged.
func warnUnknownVars(log *slog.Logger) {
	for _, u := range config.UnknownVars(os.Environ(), knownVars()) {
		log.Warn("unknown variable: no aurora service reads it", "variable", u.Name, "did_you_mean", u.Closest)
	}
}

// listVars prints, after a successful --validate, every variable the
// service reads with its value (secrets hidden, URLs redacted) and whether
// it was set or defaulted, then the AURORA_* variables set in the
// environment that this service does not read.
func listVars(w io.Writer, service string) error {
	proto, ok := serviceConfigs()[service]
	if !ok {
		return nil
	}
	cfg := reflect.New(reflect.TypeOf(proto).Elem()).Interface().(config.Validator)
	if err := config.Load(cfg); err != nil {
		return err
	}
	fmt.Fprintf(w, "aurora %s reads:\n", service)
	reads := map[string]bool{}
	for _, v := range config.Vars(cfg) {
		reads[v.Name] = true
		src := "default"
		if v.Set {
			src = "set"
		}
		fmt.Fprintf(w, "  %s=%s (%s)\n", v.Name, v.Value, src)
	}
	who := readers()
	var ignored []string
	for _, kv := range os.Environ() {
		name, val, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, config.Prefix) && val != "" && !reads[name] {
			if r, known := who[name]; known {
				ignored = append(ignored, fmt.Sprintf("  %s (read by %s)", name, strings.Join(r, ", ")))
			} else {
				ignored = append(ignored, fmt.Sprintf("  %s (unknown: did you mean %s?)", name, config.Closest(name, knownVars())))
			}
		}
	}
	if len(ignored) > 0 {
		sort.Strings(ignored)
		fmt.Fprintf(w, "set but not read by aurora %s:\n%s\n", service, strings.Join(ignored, "\n"))
	}
	return nil
}

// installVarHooks warns about unknown variables before every subcommand
// and lists the service's variables after a successful --validate.
func installVarHooks(root *cobra.Command) {
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		warnUnknownVars(logger())
		return nil
	}
	root.PersistentPostRunE = func(cmd *cobra.Command, _ []string) error {
		if f := cmd.Flags().Lookup("validate"); f == nil || f.Value.String() != "true" {
			return nil
		}
		return listVars(cmd.OutOrStdout(), cmd.Name())
	}
}
