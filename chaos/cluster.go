package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Binaries are the real programs the harness runs.
type Binaries struct {
	Aurora     string // cmd/aurora: relay, deliverer, stripe-emulator
	NATSServer string // nats-server at the version go.mod pins (pinned consumers need ≥ 2.11)
	Ledger     string // examples/ledger: the domain-event consumer
}

// Build compiles cmd/aurora, examples/ledger and nats-server (the version
// the module requires) into dir with the go tool found on PATH, from the source tree
// src (the root of an aurora checkout; "" = the module holding the current
// directory). Errors carry the go tool's output.
func Build(ctx context.Context, dir, src string) (Binaries, error) {
	root := src
	if root == "" {
		out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
		if err != nil {
			return Binaries{}, fmt.Errorf("chaos: go env GOMOD: %w", err)
		}
		root = filepath.Dir(strings.TrimSpace(string(out)))
	}
	b := Binaries{Aurora: filepath.Join(dir, "aurora"), NATSServer: filepath.Join(dir, "nats-server"), Ledger: filepath.Join(dir, "ledger")}
	for _, t := range []struct{ out, pkg string }{{b.Aurora, "./cmd/aurora"}, {b.Ledger, "./examples/ledger"}, {b.NATSServer, "github.com/nats-io/nats-server/v2"}} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", t.out, t.pkg)
		cmd.Dir = root
		if msg, err := cmd.CombinedOutput(); err != nil {
			return Binaries{}, fmt.Errorf("chaos: go build %s: %w\n%s", t.pkg, err, msg)
		}
	}
	return b, nil
}

// postgresBin finds initdb and postgres: $AURORA_CHAOS_PG_BIN, else the
// newest /usr/lib/postgresql/*/bin, else PATH.
func postgresBin() (initdb, postgres string, err error) {
	dirs := []string{os.Getenv("AURORA_CHAOS_PG_BIN")}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin"); len(m) > 0 {
		for i := len(m) - 1; i >= 0; i-- {
			dirs = append(dirs, m[i])
		}
	}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		i, p := filepath.Join(d, "initdb"), filepath.Join(d, "postgres")
		if _, e1 := os.Stat(i); e1 == nil {
			if _, e2 := os.Stat(p); e2 == nil {
				return i, p, nil
			}
		}
	}
	i, e1 := exec.LookPath("initdb")
	p, e2 := exec.LookPath("postgres")
	if e1 != nil || e2 != nil {
		return "", "", fmt.Errorf("%w: initdb and postgres not found (set AURORA_CHAOS_PG_BIN)", ErrSetup)
	}
	return i, p, nil
}

// ErrSetup: the harness could not build or start what it runs.
var ErrSetup = errors.New("chaos: setup failed")

// postgresCluster is a Postgres cluster of the harness's own: initdb into
// dir/pg, listening on a loopback port, so it can be killed without
// touching anyone else's. As root it runs as the postgres user.
type postgresCluster struct {
	proc *proc
	port int
	tmp  string // the cluster's own directory when run as root ("" = under the work directory)
}

func startPostgres(ctx context.Context, dir string) (*postgresCluster, error) {
	initdb, postgres, err := postgresBin()
	if err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	base := dir
	var tmp string
	if os.Geteuid() == 0 {
		// Postgres refuses to run as root: the cluster runs as the
		// postgres user, in a directory of its own under the system's
		// temporary directory (dir's parents may not let it through).
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("%w: running as root needs a postgres user for the cluster: %w", ErrSetup, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if tmp, err = os.MkdirTemp("", "aurora-chaos-pg-"); err != nil {
			return nil, err
		}
		if err := os.Chown(tmp, uid, gid); err != nil {
			return nil, err
		}
		base = tmp
	}
	data, sock := filepath.Join(base, "pg"), filepath.Join(base, "pgsock")
	for _, d := range []string{data, sock} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
		if cred != nil {
			if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, err
			}
		}
	}
	cmd := exec.CommandContext(ctx, initdb, "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%w: initdb: %w\n%s", ErrSetup, err, out)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	// fsync off: a killed process loses nothing the OS has (only a machine
	// crash would), and the harness kills processes, not machines.
	p := &proc{name: "postgres", bin: postgres, dir: dir, cred: cred, env: os.Environ(),
		args: []string{"-D", data, "-p", strconv.Itoa(port), "-k", sock, "-c", "listen_addresses=127.0.0.1",
			"-c", "max_connections=300", "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "shared_buffers=64MB"}}
	if err := p.start(); err != nil {
		return nil, err
	}
	pc := &postgresCluster{proc: p, port: port, tmp: tmp}
	if err := pc.waitReady(ctx, 30*time.Second); err != nil {
		p.stop(5 * time.Second)
		return nil, err
	}
	return pc, nil
}

// url returns the URL of database db on the cluster.
func (pc *postgresCluster) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", pc.port, db)
}

func (pc *postgresCluster) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := pgx.Connect(ctx, pc.url("postgres"))
		if err == nil {
			c.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: postgres not ready after %s: %w", ErrSetup, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// createDatabase creates db on the cluster.
func (pc *postgresCluster) createDatabase(ctx context.Context, db string) error {
	c, err := pgx.Connect(ctx, pc.url("postgres"))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	return err
}

// natsCluster is n nats-server processes on loopback, clustered (routes
// between every pair) when n > 1, each with its own file store under
// dir/nats-<i>; restarted on the same ports and store.
type natsCluster struct {
	nodes []*proc
	names []string // server names, n0, n1, …
	urls  []string // client URLs, by node
}

// url is the client URL list every service is given (nats.go takes a
// comma-separated list and reconnects to any node).
func (c *natsCluster) url() string { return strings.Join(c.urls, ",") }

func startNATS(ctx context.Context, bin, dir string, n int) (*natsCluster, error) {
	c := &natsCluster{}
	var routes []string
	clientPorts := make([]int, n)
	clusterPorts := make([]int, n)
	for i := range n {
		var err error
		if clientPorts[i], err = freePort(); err != nil {
			return nil, err
		}
		if clusterPorts[i], err = freePort(); err != nil {
			return nil, err
		}
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", clusterPorts[i]))
	}
	for i := range n {
		store := filepath.Join(dir, fmt.Sprintf("nats-%d", i))
		if err := os.MkdirAll(store, 0o755); err != nil {
			return nil, err
		}
		name := fmt.Sprintf("n%d", i)
		args := []string{"-a", "127.0.0.1", "-p", strconv.Itoa(clientPorts[i]), "-js", "-sd", store, "--server_name", name}
		if n > 1 {
			args = append(args, "--cluster_name", "aurora-chaos", "--cluster", routes[i], "--routes", strings.Join(routes, ","))
		}
		p := &proc{name: "nats-" + strconv.Itoa(i), supervise: true, bin: bin, dir: dir, env: os.Environ(), args: args}
		if err := p.start(); err != nil {
			c.stop()
			return nil, err
		}
		c.nodes = append(c.nodes, p)
		c.names = append(c.names, name)
		c.urls = append(c.urls, fmt.Sprintf("nats://127.0.0.1:%d", clientPorts[i]))
	}
	for _, u := range c.urls {
		if err := waitTCP(ctx, strings.TrimPrefix(u, "nats://"), 20*time.Second); err != nil {
			c.stop()
			return nil, err
		}
	}
	if err := c.waitJetStream(ctx, 60*time.Second); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// waitJetStream waits until the cluster answers JetStream requests (a
// meta leader is elected).
func (c *natsCluster) waitJetStream(ctx context.Context, timeout time.Duration) error {
	nc, err := nats.Connect(c.url(), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.AccountInfo(actx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: JetStream not ready after %s: %w", ErrSetup, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func (c *natsCluster) stop() {
	for _, p := range c.nodes {
		p.stop(10 * time.Second)
	}
}

// node returns the node called name, nil when none is.
func (c *natsCluster) node(name string) *proc {
	for i, n := range c.names {
		if n == name {
			return c.nodes[i]
		}
	}
	return nil
}

// waitHTTP waits until GET url answers 200.
func waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("status %d", resp.StatusCode)
		} else {
			last = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s not ready after %s: %w", ErrSetup, url, timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
