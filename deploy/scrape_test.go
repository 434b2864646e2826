package deploy_test

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// Every long-running compose service with an HTTP health check (its
// /readyz) is scraped by prometheus.yml on that port, under a job named
// aurora-<service>: a service compose runs but Prometheus never scrapes
// alerts on nothing.
func TestPrometheusScrapesEveryComposeService(t *testing.T) {
	var compose struct {
		Services map[string]struct {
			Healthcheck struct {
				Test []string `yaml:"test"`
			} `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	var prom struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
			DNSSDConfigs []struct {
				Names []string `yaml:"names"`
				Port  int      `yaml:"port"`
			} `yaml:"dns_sd_configs"`
		} `yaml:"scrape_configs"`
	}
	for path, dst := range map[string]any{"../compose.yaml": &compose, "prometheus/prometheus.yml": &prom} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, dst); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	scraped := map[string]string{} // job -> "host:port"
	for _, sc := range prom.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, tg := range st.Targets {
				scraped[sc.JobName] = tg
			}
		}
		for _, d := range sc.DNSSDConfigs {
			for _, n := range d.Names {
				scraped[sc.JobName] = n + ":" + strconv.Itoa(d.Port)
			}
		}
	}
	readyz := regexp.MustCompile(`^http://127\.0\.0\.1:(\d+)/readyz$`)
	var checked int
	for name, s := range compose.Services {
		test := strings.Join(s.Healthcheck.Test, " ")
		if name == "stripe-emulator" || !strings.Contains(test, "/readyz") {
			continue // the emulator stands in for Stripe; it is not aurora's to watch
		}
		var port string
		for _, a := range s.Healthcheck.Test {
			if m := readyz.FindStringSubmatch(a); m != nil {
				port = m[1]
			}
		}
		checked++
		if got, want := scraped["aurora-"+name], name+":"+port; got != want {
			t.Errorf("compose service %s (health check on :%s/readyz): prometheus.yml job aurora-%s scrapes %q, want %q", name, port, name, got, want)
		}
	}
	if checked < 5 || compose.Services["inbox"].Healthcheck.Test == nil {
		t.Fatalf("checked %d services (inbox in compose: %v); compose.yaml not read as expected", checked, compose.Services["inbox"].Healthcheck.Test != nil)
	}
}
