// Package stripemocktest runs stripe-mock (Stripe's OpenAPI-driven mock,
// `go install github.com/stripe/stripe-mock@v0.203.0`) for contract tests:
// request shapes that stripe-mock accepts are valid against Stripe's spec.
package stripemocktest

import (
	"bufio"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// InstallHint says how to get the binary.
const InstallHint = "go install github.com/stripe/stripe-mock@v0.203.0"

var listenLine = regexp.MustCompile(`Listening for HTTP at address: (\S+)`)

// Start runs stripe-mock on loopback with system-chosen ports (HTTPS too: by
// default it would take 12112, the emulator's port) and returns its HTTP
// URL; it is killed when t ends. ok is false, and nothing runs, when the
// binary is not on PATH; a binary that fails to start fails t.
func Start(t testing.TB) (url string, ok bool) {
	t.Helper()
	bin, err := exec.LookPath("stripe-mock")
	if err != nil {
		return "", false
	}
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
		return "http://" + a, true
	case <-time.After(30 * time.Second):
		t.Fatal("stripe-mock did not report its HTTP address within 30 s")
		return "", false
	}
}
