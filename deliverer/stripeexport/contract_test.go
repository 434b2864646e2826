package stripeexport

import (
	"bufio"
	"context"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/stripeemulator"
)

// TestContract sends the exporter's real request to the emulator and to
// stripe-mock (Stripe's OpenAPI spec, when installed): both must accept the
// shape (identifier, event_name, payload keys, timestamp, Idempotency-Key).
func TestContract(t *testing.T) {
	t.Parallel()
	req := testReq
	req.Timestamp = time.Now().Add(-time.Minute)

	emu, err := stripeemulator.New(stripeemulator.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := emu.AddMeter(stripeemulator.MeterSpec{DisplayName: "API calls", EventName: req.EventName}); err != nil {
		t.Fatal(err)
	}
	if err := emu.AddCustomer(req.Customer); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(emu)
	defer hs.Close()
	targets := map[string]string{"emulator": hs.URL}
	if bin, err := exec.LookPath("stripe-mock"); err == nil {
		targets["stripe-mock"] = startStripeMock(t, bin)
	} else {
		t.Log("stripe-mock is not on PATH: the shape is checked against the emulator only; install: go install github.com/stripe/stripe-mock@v0.203.0")
	}
	for name, url := range targets {
		exp, err := New(Config{APIKey: "sk_test_123", APIBase: url}, 10*time.Second, 2)
		if err != nil {
			t.Fatal(err)
		}
		res := exp.Export(context.Background(), req)
		if res.Outcome != deliverer.OutcomeAccepted || res.HTTPStatus != 200 {
			t.Errorf("%s: %+v", name, res)
		}
	}
}

var listenLine = regexp.MustCompile(`Listening for HTTP at address: (\S+)`)

// startStripeMock runs stripe-mock on loopback with system-chosen ports and
// returns its HTTP URL.
func startStripeMock(t *testing.T, bin string) string {
	t.Helper()
	cmd := exec.Command(bin, "-http-addr", "127.0.0.1:", "-https-addr", "127.0.0.1:")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("start stripe-mock: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		found := false
		for sc.Scan() {
			if m := listenLine.FindStringSubmatch(sc.Text()); m != nil && !found {
				found = true
				addr <- m[1]
			}
		}
	}()
	select {
	case a := <-addr:
		if !strings.HasPrefix(a, "127.0.0.1:") {
			t.Fatalf("stripe-mock listens on %s, want loopback", a)
		}
		return "http://" + a
	case <-time.After(30 * time.Second):
		t.Fatal("stripe-mock did not report its HTTP address within 30 s")
		return ""
	}
}
