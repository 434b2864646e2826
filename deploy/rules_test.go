package deploy_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

var alertName = regexp.MustCompile(`(?m)^\s*- alert: (\w+)\s*$`)

// alerts returns the alert names of prometheus/alerts.yml, in file order.
func alerts(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range alertName.FindAllStringSubmatch(string(b), -1) {
		names = append(names, m[1])
	}
	if len(names) == 0 {
		t.Fatal("no alerts found in prometheus/alerts.yml")
	}
	return names
}

// Every alert has a promtool case where it fires (non-empty exp_alerts)
// and one where it must not (exp_alerts: []).
func TestEveryAlertHasFiringAndQuietUnitTests(t *testing.T) {
	b, err := os.ReadFile("prometheus/alerts_test.yml")
	if err != nil {
		t.Fatal(err)
	}
	firing, quiet := map[string]bool{}, map[string]bool{}
	cases := regexp.MustCompile(`alertname: (\w+)\s*\n\s*exp_alerts:(.*)`).FindAllStringSubmatch(string(b), -1)
	for _, c := range cases {
		if strings.TrimSpace(c[2]) == "[]" {
			quiet[c[1]] = true
		} else {
			firing[c[1]] = true
		}
	}
	for _, a := range alerts(t) {
		if !firing[a] {
			t.Errorf("%s: no unit test where it fires", a)
		}
		if !quiet[a] {
			t.Errorf("%s: no unit test where it must stay quiet", a)
		}
	}
}

// promtool itself, as .ci/run runs it; skipped only where the Debian
// prometheus package is not installed (.ci/run installs it).
func TestPromtoolChecksAndTestsTheRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not on PATH: install Debian's prometheus package (apt-get install prometheus); .ci/run does")
	}
	for _, args := range [][]string{
		{"check", "rules", "prometheus/alerts.yml"},
		{"test", "rules", "prometheus/alerts_test.yml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// Every alert has a RUNBOOK.md section of its name with the five parts, and
// its runbook annotation points at that section.
func TestEveryAlertHasARunbookSection(t *testing.T) {
	b, err := os.ReadFile("../RUNBOOK.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	for _, part := range strings.Split(string(b), "\n## ")[1:] {
		title, body, _ := strings.Cut(part, "\n")
		sections[strings.TrimSpace(title)] = body
	}
	rules, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range alerts(t) {
		body, ok := sections[a]
		if !ok {
			t.Errorf("RUNBOOK.md has no section %q", a)
			continue
		}
		for _, part := range []string{"**Meaning.**", "**Money at stake.**", "**First commands.**", "**Resolve with evidence.**", "**Never.**"} {
			if !strings.Contains(body, part) {
				t.Errorf("RUNBOOK.md %s lacks %s", a, part)
			}
		}
		if !strings.Contains(string(rules), "runbook: RUNBOOK.md#"+strings.ToLower(a)+"\n") {
			t.Errorf("alert %s: no runbook annotation RUNBOOK.md#%s", a, strings.ToLower(a))
		}
	}
}
