package main

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"github.com/aurora-billing/aurora/internal/syncbuf"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/natstest"
	"go.yaml.in/yaml/v3"
)

// The aurora image's services, as compose.yaml runs them, become healthy:
// with no Docker on this machine the test reads compose.yaml and the
// Dockerfile, builds the image's binaries as the Dockerfile does, and runs
// every service of the aurora image with its entrypoint, command and
// environment (interpolated with the defaults), in depends_on order, with
// compose's network replaced by this machine's: the postgres service by a
// fresh database of the test's, nats by an embedded JetStream server,
// every other service's host by 127.0.0.1 and each listening port by a
// free one (the same replacement in its health check), named volumes by
// temporary directories. A one-shot service must exit 0; every other must
// keep running, and one with a health check must pass it (the check's
// command, run as compose would) within interval × retries.
func TestComposeServicesBecomeHealthy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the image's binaries and starts every service")
	}
	const root = "../.."
	cf := readComposeFile(t, filepath.Join(root, "compose.yaml"))
	img := readDockerfile(t, filepath.Join(root, "Dockerfile"))
	bin := t.TempDir()
	img.build(t, root, bin)
	if out, err := exec.Command("docker", "compose", "version").CombinedOutput(); err == nil {
		cmd := exec.Command("docker", "compose", "-f", filepath.Join(root, "compose.yaml"), "config", "-q")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("docker compose config: %v\n%s", err, out)
		}
	} else {
		t.Logf("no compose client (%v: %s): compose.yaml is read by this test alone", err, bytes.TrimSpace(out))
	}

	env := &composeEnv{
		t:       t,
		dbURL:   dbtest.NewEmptyDatabase(t), // the migrate service migrates it
		natsURL: natstest.New(t).URL(),
		bin:     bin,
		imgBin:  img.binDir,
		entry:   img.entrypoint,
		root:    root,
		ports:   map[string]string{},
		volumes: map[string]string{},
	}
	pgEnv := cf.Services["postgres"].Environment
	env.pg.user = cmp.Or(pgEnv["POSTGRES_USER"], "postgres")
	env.pg.password = pgEnv["POSTGRES_PASSWORD"]
	env.pg.db = cmp.Or(pgEnv["POSTGRES_DB"], env.pg.user)
	var names []string
	for name, s := range cf.Services {
		if s.Image == img.name {
			names = append(names, name)
		} else {
			t.Logf("%s: image %q, not aurora's: %s", name, s.Image, map[bool]string{true: "replaced by the test's own", false: "not run"}[name == "postgres" || name == "nats"])
		}
	}
	order, err := dependencyOrder(cf.Services, names)
	if err != nil {
		t.Fatal(err)
	}
	if len(order) == 0 {
		t.Fatalf("compose.yaml has no service of image %s", img.name)
	}
	for _, name := range order {
		env.requireRemoteURLs(name, cf.Services[name])
	}
	// every listening port first: a service may name another's
	for _, name := range order {
		env.allocatePorts(name, cf.Services[name])
	}

	procs := map[string][]*composeProc{}
	// running: every replica started so far, so a wait fails as soon as
	// any of them exits, naming it
	var running []*composeProc
	t.Cleanup(func() {
		for _, name := range slices.Backward(order) {
			for _, p := range procs[name] {
				p.stop()
			}
		}
	})
	for _, name := range order {
		s := cf.Services[name]
		for dep, cond := range s.DependsOn {
			if _, ours := cf.Services[dep]; !ours || !slices.Contains(order, dep) {
				continue // postgres, nats: the test's own, ready
			}
			for _, p := range procs[dep] {
				p.await(t, cond.Condition, running)
			}
		}
		replicas := 1
		if s.Deploy.Replicas > 0 {
			replicas = s.Deploy.Replicas
		}
		for r := range replicas {
			p := env.start(name, r, s)
			procs[name] = append(procs[name], p)
			running = append(running, p)
		}
	}
	// every service: healthy, done, or (without a health check) running
	for _, name := range order {
		for _, p := range procs[name] {
			switch {
			case p.oneShot:
				p.await(t, "service_completed_successfully", running)
			case len(p.check) > 0:
				p.await(t, "service_healthy", running)
			default:
				p.await(t, "service_started", running)
			}
		}
	}
	for _, name := range order {
		for _, p := range procs[name] {
			if !p.oneShot {
				if err := p.exited(); err != nil {
					t.Errorf("%s exited after the others became healthy: %v\n%s", p.name, err, p.logTail())
				}
			}
			t.Logf("%s: %s", p.name, p.state())
		}
	}
}

// composeFile is the part of compose.yaml the test reads.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string              `yaml:"image"`
	Entrypoint  stringOrList        `yaml:"entrypoint"`
	Command     stringOrList        `yaml:"command"`
	Environment composeEnvironment  `yaml:"environment"`
	DependsOn   composeDependencies `yaml:"depends_on"`
	Volumes     []string            `yaml:"volumes"`
	Restart     string              `yaml:"restart"`
	Deploy      struct {
		Replicas int `yaml:"replicas"`
	} `yaml:"deploy"`
	Healthcheck struct {
		Test     stringOrList `yaml:"test"`
		Interval string       `yaml:"interval"`
		Timeout  string       `yaml:"timeout"`
		Retries  int          `yaml:"retries"`
	} `yaml:"healthcheck"`
}

// stringOrList is compose's command form: a list, or a string split on
// spaces.
type stringOrList []string

func (s *stringOrList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*s = strings.Fields(n.Value)
		return nil
	}
	var l []string
	if err := n.Decode(&l); err != nil {
		return err
	}
	*s = l
	return nil
}

// composeEnvironment is a map, or a list of NAME=value.
type composeEnvironment map[string]string

func (e *composeEnvironment) UnmarshalYAML(n *yaml.Node) error {
	out := map[string]string{}
	if n.Kind == yaml.SequenceNode {
		var l []string
		if err := n.Decode(&l); err != nil {
			return err
		}
		for _, kv := range l {
			k, v, _ := strings.Cut(kv, "=")
			out[k] = v
		}
	} else if err := n.Decode(&out); err != nil {
		return err
	}
	*e = out
	return nil
}

// composeDependencies is a map of name to condition, or a list of names
// (condition service_started).
type composeDependencies map[string]struct {
	Condition string `yaml:"condition"`
}

func (d *composeDependencies) UnmarshalYAML(n *yaml.Node) error {
	out := composeDependencies{}
	if n.Kind == yaml.SequenceNode {
		var l []string
		if err := n.Decode(&l); err != nil {
			return err
		}
		for _, name := range l {
			out[name] = struct {
				Condition string `yaml:"condition"`
			}{"service_started"}
		}
	} else {
		var m map[string]struct {
			Condition string `yaml:"condition"`
		}
		if err := n.Decode(&m); err != nil {
			return err
		}
		for k, v := range m {
			if v.Condition == "" {
				v.Condition = "service_started"
			}
			out[k] = v
		}
	}
	*d = out
	return nil
}

func readComposeFile(t *testing.T, path string) composeFile {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return cf
}

// image is what the test takes from the Dockerfile: the binaries it builds
// (go build -o /out/NAME ./PACKAGE), where it copies them, its entrypoint
// and the image name compose gives it.
type image struct {
	name       string
	binDir     string            // e.g. /usr/local/bin/
	binaries   map[string]string // name → package
	entrypoint []string
}

var (
	dockerBuild = regexp.MustCompile(`go build [^&\n]*-o /out/(\S+) (\./\S+)`)
	dockerCopy  = regexp.MustCompile(`(?m)^COPY --from=build /out/\S+.* (/\S+/)$`)
	dockerEntry = regexp.MustCompile(`(?m)^ENTRYPOINT \[(.*)\]$`)
)

func readDockerfile(t *testing.T, path string) image {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img := image{name: "aurora:local", binaries: map[string]string{}}
	for _, m := range dockerBuild.FindAllStringSubmatch(string(raw), -1) {
		img.binaries[m[1]] = m[2]
	}
	if m := dockerCopy.FindStringSubmatch(string(raw)); m != nil {
		img.binDir = m[1]
	}
	if m := dockerEntry.FindStringSubmatch(string(raw)); m != nil {
		for _, part := range strings.Split(m[1], ",") {
			img.entrypoint = append(img.entrypoint, strings.Trim(strings.TrimSpace(part), `"`))
		}
	}
	if len(img.binaries) == 0 || img.binDir == "" || len(img.entrypoint) == 0 {
		t.Fatalf("%s: no go build -o /out/…, COPY --from=build or ENTRYPOINT found (%+v)", path, img)
	}
	return img
}

// build builds the image's binaries into dir as the Dockerfile does.
func (img image) build(t *testing.T, root, dir string) {
	t.Helper()
	for name, pkg := range img.binaries {
		cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, name), pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
}

// dependencyOrder sorts names so each comes after the services it depends
// on (ties by name).
func dependencyOrder(services map[string]composeService, names []string) ([]string, error) {
	sort.Strings(names)
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(string) error
	visit = func(n string) error {
		switch state[n] {
		case 1:
			return fmt.Errorf("compose.yaml: depends_on cycle through %s", n)
		case 2:
			return nil
		}
		state[n] = 1
		deps := make([]string, 0, len(services[n].DependsOn))
		for d := range services[n].DependsOn {
			if slices.Contains(names, d) {
				deps = append(deps, d)
			}
		}
		sort.Strings(deps)
		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		state[n] = 2
		order = append(order, n)
		return nil
	}
	for _, n := range names {
		if err := visit(n); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// composeEnv replaces compose's network, volumes and binaries by the
// test's.
type composeEnv struct {
	t       *testing.T
	dbURL   string
	natsURL string
	bin     string                              // where the image's binaries were built
	imgBin  string                              // where the image has them
	entry   []string                            // the image's ENTRYPOINT
	pg      struct{ user, password, db string } // what the postgres service creates
	root    string
	mu      sync.Mutex
	ports   map[string]string // "service/replica/port" → 127.0.0.1:free
	volumes map[string]string // named volume → directory
}

var (
	// a bare host:port in a service's environment is an address it
	// listens on (inside its container 127.0.0.1 is its own)
	listenAddr    = regexp.MustCompile(`^(0\.0\.0\.0|\[::\]|127\.0\.0\.1|localhost|)?:(\d+)$`)
	interpolation = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:?-([^}]*))?\}`)
)

// allocatePorts gives every port a service listens on (a 0.0.0.0:PORT or
// 127.0.0.1:PORT value in its environment) a free local port per replica.
func (e *composeEnv) allocatePorts(name string, s composeService) {
	replicas := max(1, s.Deploy.Replicas)
	for _, v := range s.Environment {
		m := listenAddr.FindStringSubmatch(interpolate(v))
		if m == nil {
			continue
		}
		for r := range replicas {
			e.ports[fmt.Sprintf("%s/%d/%s", name, r, m[2])] = freeAddr(e.t)
		}
	}
}

// interpolate applies compose's ${VAR:-default} and ${VAR-default} with
// every variable unset (the defaults compose.yaml documents), ${VAR} as
// empty.
func interpolate(v string) string {
	return interpolation.ReplaceAllStringFunc(v, func(m string) string {
		return interpolation.FindStringSubmatch(m)[3]
	})
}

// rewrite maps one value as seen inside compose's network to this machine.
func (e *composeEnv) rewrite(service string, replica int, v string) (string, error) {
	v = interpolate(v)
	if m := listenAddr.FindStringSubmatch(v); m != nil {
		return e.ports[fmt.Sprintf("%s/%d/%s", service, replica, m[2])], nil
	}
	if strings.HasPrefix(v, e.imgBin) {
		return filepath.Join(e.bin, strings.TrimPrefix(v, e.imgBin)), nil
	}
	u, err := url.Parse(v)
	if err != nil || u.Host == "" {
		return e.rewritePath(v), nil
	}
	host, port := u.Hostname(), u.Port()
	switch {
	case host == "postgres" && (u.Scheme == "postgres" || u.Scheme == "postgresql"):
		pw, _ := u.User.Password()
		if got, want := fmt.Sprintf("%s:%s@%s/%s", u.User.Username(), pw, cmp.Or(port, "5432"), strings.TrimPrefix(u.Path, "/")),
			fmt.Sprintf("%s:%s@5432/%s", e.pg.user, e.pg.password, e.pg.db); got != want {
			return "", fmt.Errorf("%s names postgres as %s (user:password@port/database); the postgres service is %s", service, got, want)
		}
		own, err := url.Parse(e.dbURL)
		if err != nil {
			return "", err
		}
		q := own.Query()
		for k, vs := range u.Query() {
			q[k] = vs
		}
		own.RawQuery = q.Encode()
		return own.String(), nil
	case host == "nats":
		if u.Scheme != "nats" || cmp.Or(port, "4222") != "4222" {
			return "", fmt.Errorf("%s names nats as %s://nats:%s; the nats service listens on nats://nats:4222", service, u.Scheme, port)
		}
		return e.natsURL, nil
	case host == "127.0.0.1" || host == "localhost":
		addr, ok := e.ports[fmt.Sprintf("%s/%d/%s", service, replica, port)]
		if !ok {
			return "", fmt.Errorf("%s names its own port %s, which it does not listen on (no 0.0.0.0:%s in its environment)", service, port, port)
		}
		u.Host = addr
		return u.String(), nil
	case !strings.Contains(host, "."):
		addr, ok := e.ports[fmt.Sprintf("%s/0/%s", host, port)]
		if !ok {
			return "", fmt.Errorf("%s names %s:%s, which no aurora service listens on", service, host, port)
		}
		u.Host = addr
		return u.String(), nil
	}
	return v, nil // an outside address, e.g. https://api.stripe.com
}

// rewritePath maps a path under a named volume's mount point to the
// test's directory for that volume.
func (e *composeEnv) rewritePath(v string) string {
	if !strings.HasPrefix(v, "/") {
		return v
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for mount, dir := range e.volumes {
		if v == mount || strings.HasPrefix(v, strings.TrimSuffix(mount, "/")+"/") {
			return filepath.Join(dir, strings.TrimPrefix(v, mount))
		}
	}
	return v
}

// requireRemoteURLs fails the test when an aurora service of compose.yaml
// leaves unset a variable it reads whose default is a URL on 127.0.0.1
// (AURORA_DATABASE_URL, AURORA_NATS_URL, …): inside a container that
// address is the container itself, though on this machine the default
// would reach the machine's own Postgres or NATS and hide the mistake.
func (e *composeEnv) requireRemoteURLs(name string, s composeService) {
	argv := append(slices.Clone([]string(s.Entrypoint)), s.Command...)
	if len(s.Entrypoint) == 0 {
		argv = append(slices.Clone(e.entry), s.Command...)
	}
	if len(argv) < 2 || filepath.Base(argv[0]) != "aurora" {
		e.t.Logf("%s: %s is not aurora's service command; its variables are not checked here", name, argv)
		return
	}
	cfg, ok := serviceConfigs()[argv[1]]
	if !ok {
		return
	}
	for _, v := range config.Vars(cfg) {
		u, err := url.Parse(v.Default)
		if err != nil || u.Scheme == "" || (u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost") {
			continue
		}
		if _, set := s.Environment[v.Name]; !set {
			e.t.Errorf("%s: compose.yaml does not set %s, which aurora %s reads: its default %s is the container itself",
				name, v.Name, argv[1], config.RedactURL(v.Default))
		}
	}
}

// start runs one replica of a service.
func (e *composeEnv) start(name string, replica int, s composeService) *composeProc {
	t := e.t
	t.Helper()
	e.mu.Lock()
	for _, vol := range s.Volumes {
		parts := strings.Split(vol, ":")
		if len(parts) >= 2 && !strings.HasPrefix(parts[0], ".") && !strings.HasPrefix(parts[0], "/") {
			e.volumes[parts[1]] = t.TempDir()
		}
	}
	e.mu.Unlock()
	label := name
	if s.Deploy.Replicas > 1 {
		label = fmt.Sprintf("%s-%d", name, replica+1)
	}
	argv := append(slices.Clone([]string(s.Entrypoint)), s.Command...)
	if len(s.Entrypoint) == 0 {
		argv = append(slices.Clone(e.entry), s.Command...)
	}
	for i, a := range argv {
		r, err := e.rewrite(name, replica, a)
		if err != nil {
			t.Fatalf("%s: command: %v", label, err)
		}
		argv[i] = r
	}
	home := t.TempDir()
	environ := []string{"HOME=" + home, "PATH=" + os.Getenv("PATH")}
	keys := make([]string, 0, len(s.Environment))
	for k := range s.Environment {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, err := e.rewrite(name, replica, s.Environment[k])
		if err != nil {
			t.Fatalf("%s: %s: %v", label, k, err)
		}
		environ = append(environ, k+"="+v)
	}
	var check []string
	if hc := s.Healthcheck.Test; len(hc) > 0 {
		switch hc[0] {
		case "CMD":
			for _, a := range hc[1:] {
				r, err := e.rewrite(name, replica, a)
				if err != nil {
					t.Fatalf("%s: healthcheck: %v", label, err)
				}
				check = append(check, r)
			}
		case "NONE":
		default:
			t.Fatalf("%s: healthcheck %q: only the CMD form is run here", label, hc)
		}
	}
	bound := time.Minute
	if s.Healthcheck.Interval != "" && s.Healthcheck.Retries > 0 {
		iv, err := time.ParseDuration(s.Healthcheck.Interval)
		if err != nil {
			t.Fatalf("%s: healthcheck interval: %v", label, err)
		}
		bound = iv * time.Duration(s.Healthcheck.Retries)
	}
	p := &composeProc{name: label, check: check, env: environ, bound: bound, oneShot: s.Restart == "no",
		log: &syncbuf.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = environ
	p.cmd.Dir = home
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: start %v: %v", label, argv, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Logf("%s: started %s", label, strings.Join(argv, " "))
	return p
}

// composeProc is one running replica.
type composeProc struct {
	name    string
	cmd     *exec.Cmd
	check   []string // the health check command, rewritten; empty: none
	env     []string
	bound   time.Duration // interval × retries: compose gives up after it
	oneShot bool          // restart: "no" (the migration)
	log     *syncbuf.Buffer
	done    chan struct{}
	err     error
	healthy bool
}

// await blocks until the process meets a depends_on condition, failing the
// test if it cannot or if a long-running process of all exits meanwhile.
func (p *composeProc) await(t *testing.T, condition string, all []*composeProc) {
	t.Helper()
	switch condition {
	case "service_started":
		if err := p.exited(); err != nil {
			t.Fatalf("%s exited: %v\n%s", p.name, err, p.logTail())
		}
	case "service_completed_successfully":
		select {
		case <-p.done:
			if p.err != nil {
				t.Fatalf("%s did not complete successfully: %v\n%s", p.name, p.err, p.logTail())
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s did not complete within 2 min\n%s", p.name, p.logTail())
		}
	case "service_healthy":
		if p.healthy {
			return
		}
		if len(p.check) == 0 {
			t.Fatalf("%s: depended on as service_healthy but has no health check", p.name)
		}
		deadline := time.Now().Add(p.bound)
		var last string
		for {
			for _, o := range all {
				if err := o.exited(); err != nil && !o.oneShot {
					t.Fatalf("%s exited while %s was not healthy yet: %v\nlast check of %s: %s\n%s", o.name, p.name, err, p.name, last, o.logTail())
				}
			}
			cmd := exec.Command(p.check[0], p.check[1:]...)
			cmd.Env = p.env
			out, err := cmd.CombinedOutput()
			if err == nil {
				p.healthy = true
				t.Logf("%s: healthy (%s)", p.name, strings.Join(p.check, " "))
				return
			}
			last = fmt.Sprintf("%v: %s", err, bytes.TrimSpace(out))
			if time.Now().After(deadline) {
				t.Fatalf("%s not healthy within %s (interval × retries): %s\n%s", p.name, p.bound, last, p.logTail())
			}
			time.Sleep(200 * time.Millisecond)
		}
	default:
		t.Fatalf("%s: depends_on condition %q not known", p.name, condition)
	}
}

// exited returns nil while the process runs, else how it ended.
func (p *composeProc) exited() error {
	select {
	case <-p.done:
		if p.err == nil {
			return errors.New("exit status 0")
		}
		return p.err
	default:
		return nil
	}
}

func (p *composeProc) state() string {
	select {
	case <-p.done:
		if p.err == nil {
			return "exited 0"
		}
		return p.err.Error()
	default:
		if p.healthy {
			return "running, healthy"
		}
		return "running"
	}
}

// stop sends SIGTERM (compose down), then SIGKILL after 10 s.
func (p *composeProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// logTail is the last 40 lines the process wrote.
func (p *composeProc) logTail() string {
	lines := strings.Split(strings.TrimRight(p.log.String(), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return "--- " + p.name + " output (last " + strconv.Itoa(len(lines)) + " lines):\n" + strings.Join(lines, "\n")
}
