package main

import (
	"bytes"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/admin"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/events"
)

var updateREADME = flag.Bool("update-readme", false, "rewrite the README's variable table from serviceConfigs")

// Every subcommand with --validate is in serviceConfigs (else its
// variables would be unknown to the warning and missing from the table).
func TestEveryValidatingSubcommandIsRegistered(t *testing.T) {
	cfgs := serviceConfigs()
	for _, c := range newRootCmd().Commands() {
		if c.Flags().Lookup("validate") == nil {
			continue
		}
		if _, ok := cfgs[c.Name()]; !ok {
			t.Errorf("aurora %s has --validate but no entry in serviceConfigs", c.Name())
		}
	}
}

// --validate lists exactly the variables the service's configuration
// reads, once each.
func TestValidateListsExactlyTheVariablesRead(t *testing.T) {
	t.Setenv("AURORA_STRIPE_WEBHOOK_SECRET", "whsec_test") // the inbox requires one
	t.Setenv("AURORA_STRIPE_API_KEY", "sk_test_vars")      // the deliverer and reconciler require one
	for svc, cfg := range serviceConfigs() {
		var buf bytes.Buffer
		if err := listVars(&buf, svc); err != nil {
			t.Fatalf("%s: %v", svc, err)
		}
		var listed []string
		for _, line := range strings.Split(buf.String(), "\n") {
			if name, _, ok := strings.Cut(strings.TrimPrefix(line, "  "), "="); ok && strings.HasPrefix(line, "  AURORA_") {
				listed = append(listed, name)
			}
		}
		sort.Strings(listed)
		if want := config.Names(cfg); strings.Join(listed, ",") != strings.Join(want, ",") {
			t.Errorf("%s lists %v, reads %v", svc, listed, want)
		}
		if strings.Contains(buf.String(), "whsec_test") || strings.Contains(buf.String(), "sk_test_vars") {
			t.Errorf("%s printed a secret:\n%s", svc, buf.String())
		}
	}
}

func TestUnknownVariableNamedWithTheClosest(t *testing.T) {
	t.Setenv("AURORA_RELAY_WORKRS", "3")
	t.Setenv("AURORA_STRIPE_ACCOUNT", "acct_vars")
	var logs bytes.Buffer
	warnUnknownVars(slog.New(slog.NewTextHandler(&logs, nil)))
	if !strings.Contains(logs.String(), "variable=AURORA_RELAY_WORKRS did_you_mean=AURORA_RELAY_WORKERS") || strings.Contains(logs.String(), "=3") {
		t.Fatalf("warning: %q", logs.String())
	}
	var out bytes.Buffer
	if err := listVars(&out, "relay"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"AURORA_RELAY_WORKRS (unknown: did you mean AURORA_RELAY_WORKERS?)", "AURORA_STRIPE_ACCOUNT (read by "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("relay --validate lacks %q:\n%s", want, out.String())
		}
	}
	if code := run(t.Context(), []string{"relay", "--validate"}); code != 0 {
		t.Fatalf("an unknown variable is a warning, not a refusal: exit %d", code)
	}
}

const tableBegin, tableEnd = "<!-- variables: rendered from cmd/aurora/vars.go by TestREADMEVariableTable -->\n", "<!-- end of variables -->\n"

// renderVarTable is the README's table of which service reads which
// variable.
func renderVarTable() string {
	cfgs := serviceConfigs()
	defaults := map[string]string{}
	for _, cfg := range append(slices.Collect(maps.Values(cfgs)), &events.Config{}) {
		for _, v := range config.Vars(cfg) {
			if v.Default != "" {
				defaults[v.Name] = v.Default
			}
		}
	}
	var b strings.Builder
	b.WriteString("| variable | default | read by |\n|---|---|---|\n")
	r := readers()
	for _, n := range knownVars() {
		d := defaults[n]
		if d != "" {
			d = "`" + d + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", n, d, strings.Join(r[n], ", "))
	}
	return b.String()
}

func TestREADMEVariableTable(t *testing.T) {
	const path = "../../README.md"
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	i, j := strings.Index(s, tableBegin), strings.Index(s, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("README.md has no variable table between %q and %q", tableBegin, tableEnd)
	}
	want := renderVarTable()
	if got := s[i+len(tableBegin) : j]; got != want {
		if *updateREADME {
			if err := os.WriteFile(path, []byte(s[:i+len(tableBegin)]+want+s[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Fatalf("README.md's variable table is stale; run go test ./cmd/aurora -run TestREADMEVariableTable -update-readme\nwant:\n%s", want)
	}
}

// The relay dispatches domain events and consumes none: it reads none of
// the consumer knobs, says so for one that is set, and a consumer's knob
// is not warned about as unknown (an events consumer reads it).
func TestRelayReadsNoConsumerKnob(t *testing.T) {
	t.Setenv("AURORA_EVENTS_CONSUMER_INTERVAL_MS", "100")
	for _, n := range config.Names(&relayConfig{}) {
		if strings.HasPrefix(n, "AURORA_EVENTS_CONSUMER_") || n == "AURORA_EVENTS_CATCH_UP_LIMIT" {
			t.Errorf("the relay reads the consumer knob %s", n)
		}
	}
	var out bytes.Buffer
	if err := listVars(&out, "relay"); err != nil {
		t.Fatal(err)
	}
	if want := "  AURORA_EVENTS_CONSUMER_INTERVAL_MS (read by events consumer)"; !strings.Contains(out.String(), want) {
		t.Errorf("relay --validate lacks %q:\n%s", want, out.String())
	}
	var logs bytes.Buffer
	warnUnknownVars(slog.New(slog.NewTextHandler(&logs, nil)))
	if strings.Contains(logs.String(), "AURORA_EVENTS_CONSUMER_INTERVAL_MS") {
		t.Errorf("a consumer knob warned about as unknown: %s", logs.String())
	}
}

// auroractl cannot import this command's configuration structs, so it
// keeps its own list of known variables to warn against; it must be this
// command's.
func TestAuroractlKnowsEveryVariable(t *testing.T) {
	want := knownVars()
	if got := admin.KnownVars(); !slices.Equal(got, want) {
		var b strings.Builder
		for _, n := range want {
			fmt.Fprintf(&b, "\t\t%q,\n", n)
		}
		t.Fatalf("admin.KnownVars differs from cmd/aurora's knownVars; its list should be:\n%s", b.String())
	}
}
