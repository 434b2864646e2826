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
