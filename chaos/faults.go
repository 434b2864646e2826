package chaos

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/nats-io/nats.go/jetstream"
)

// FaultKind names a fault the harness injects.
type FaultKind string

// The fault kinds.
const (
	// FaultKillOwner: kill -9 the deliverer that owns the most hot
	// partitions (aurora_deliverer_partition_owned), restart it after the
	// fault's downtime.
	FaultKillOwner FaultKind = "kill_owner"
	// FaultKillDeliverer: kill -9 a deliverer picked by the seed.
	FaultKillDeliverer FaultKind = "kill_deliverer"
	// FaultStopCont: SIGSTOP a deliverer picked by the seed, SIGCONT after
	// the downtime (sometimes past its lease and its pinned TTL).
	FaultStopCont FaultKind = "stop_cont"
	// FaultKillRelay: kill -9 one of the relays (picked by the seed),
	// restart it after the downtime.
	FaultKillRelay FaultKind = "kill_relay"
	// FaultStopLong: SIGSTOP a deliverer for longer than its lease and its
	// JetStream ack wait (Options.LeaseSeconds + 16–25 s), then SIGCONT:
	// it wakes holding leases others have taken over, and every outcome it
	// then writes must be fenced off by lease_token.
	FaultStopLong FaultKind = "stop_long"
	// FaultKillPostgres: kill -9 the Postgres postmaster, start it again
	// (crash recovery from its WAL) after the downtime. Every service must
	// wait the outage out; nothing committed may be lost.
	FaultKillPostgres FaultKind = "kill_postgres"
	// FaultRestartNATS: kill -9 every nats-server node at once, start them
	// again on their stores after the downtime (a full NATS restart).
	FaultRestartNATS FaultKind = "restart_nats"
	// FaultFreezeNATS: SIGSTOP every nats-server node for 6.5–9 s (longer
	// than the clients' request timeouts; connections stay open but
	// silent), then SIGCONT.
	FaultFreezeNATS FaultKind = "freeze_nats"
	// FaultDeleteConsumer: delete every durable consumer of AURORA_OUTBOX
	// (the deliverers' partition consumers) under load, as `nats consumer
	// rm` would; the deliverers must create them again and nothing
	// unacknowledged may be lost (the stream keeps the messages).
	FaultDeleteConsumer FaultKind = "delete_consumer"
	// FaultKillInbox: kill -9 an inbox (webhook endpoint and worker)
	// picked by the seed, restart it after the downtime.
	FaultKillInbox FaultKind = "kill_inbox"
)

// The faults of a NATS cluster (Options.NATSNodes > 1).
const (
	// FaultKillStreamLeader: kill -9 the nats-server leading AURORA_OUTBOX,
	// restart it (same store) after the downtime.
	FaultKillStreamLeader FaultKind = "kill_stream_leader"
	// FaultKillStreamFollower: kill -9 a nats-server that replicates
	// AURORA_OUTBOX without leading it.
	FaultKillStreamFollower FaultKind = "kill_stream_follower"
)

// Kinds lists every fault kind, in a fixed order (the schedule draws by it).
var Kinds = []FaultKind{FaultKillOwner, FaultKillDeliverer, FaultStopCont, FaultKillRelay, FaultKillStreamLeader, FaultKillStreamFollower,
	FaultStopLong, FaultKillPostgres, FaultRestartNATS, FaultFreezeNATS, FaultDeleteConsumer, FaultKillConsumer, FaultKillReconciler,
	FaultKillInbox}

// DefaultWeights: the short mode's mix.
func DefaultWeights() map[FaultKind]float64 {
	return map[FaultKind]float64{FaultKillOwner: 0.22, FaultKillDeliverer: 0.08, FaultStopCont: 0.15, FaultKillRelay: 0.15,
		FaultStopLong: 0.03, FaultKillPostgres: 0.07, FaultRestartNATS: 0.04, FaultFreezeNATS: 0.03, FaultDeleteConsumer: 0.04,
		FaultKillConsumer: 0.08, FaultKillReconciler: 0.05, FaultKillInbox: 0.06}
}

// stopLongPast: how far past the lease a stop_long fault's SIGCONT comes
// (drawn in this range, added to Options.LeaseSeconds); with the deliverers'
// 30 s ack wait and a 20 s lease, 36–45 s is past both.
var stopLongPast = [2]time.Duration{16 * time.Second, 25 * time.Second}

// Planned is one fault of a schedule: when (offset from the start of the
// load), what, for how long the target stays down or stopped, and a draw
// that picks a target where the kind leaves it to chance.
type Planned struct {
	At   time.Duration
	Kind FaultKind
	Down time.Duration
	Pick float64 // in [0, 1)
}

// Schedule returns the faults of a run: gaps drawn in [gap[0], gap[1]]
// until span, kinds by weight, downtimes by kind. Equal arguments give the
// equal schedules (PCG seeded by seed).
func Schedule(seed uint64, span time.Duration, gap [2]time.Duration, weights map[FaultKind]float64) []Planned {
	rng := rand.New(rand.NewPCG(seed, 0x6368616f73)) // "chaos"
	total := 0.0
	for _, k := range Kinds {
		total += weights[k]
	}
	between := func(lo, hi time.Duration) time.Duration {
		if hi <= lo {
			return lo
		}
		return lo + time.Duration(rng.Int64N(int64(hi-lo)))
	}
	var out []Planned
	at := time.Duration(0)
	for {
		at += between(gap[0], gap[1])
		if at >= span {
			return out
		}
		x := rng.Float64() * total
		var kind FaultKind
		for _, k := range Kinds {
			if weights[k] > 0 {
				kind = k // the last kind with a weight, should rounding leave x ≥ 0
			}
		}
		for _, k := range Kinds {
			if x < weights[k] {
				kind = k
				break
			}
			x -= weights[k]
		}
		var down time.Duration
		switch kind {
		case FaultKillOwner, FaultKillDeliverer, FaultKillConsumer, FaultKillReconciler, FaultKillInbox:
			down = between(500*time.Millisecond, 3*time.Second)
		case FaultStopCont:
			// mostly shorter than the pinned TTL, one in four well past
			// it (and past a short lease)
			if rng.IntN(4) == 0 {
				down = between(12*time.Second, 25*time.Second)
			} else {
				down = between(1*time.Second, 8*time.Second)
			}
		case FaultKillRelay:
			down = between(200*time.Millisecond, 2*time.Second)
		case FaultKillStreamLeader, FaultKillStreamFollower:
			down = between(1*time.Second, 5*time.Second)
		case FaultStopLong:
			down = between(stopLongPast[0], stopLongPast[1]) // + the lease, added when fired
		case FaultKillPostgres:
			down = between(1*time.Second, 4*time.Second)
		case FaultRestartNATS:
			down = between(1*time.Second, 3*time.Second)
		case FaultFreezeNATS:
			down = between(6500*time.Millisecond, 9*time.Second)
		case FaultDeleteConsumer:
			down = 0
		}
		out = append(out, Planned{At: at, Kind: kind, Down: down, Pick: rng.Float64()})
	}
}

// Fault is an injected fault, as it happened.
type Fault struct {
	Planned
	Target string    `json:"target"`
	Start  time.Time `json:"start"`
	// Partitions the target owned when it was hit (deliverers; as of its
	// last attach check), and of those the hot ones.
	Owned []int `json:"owned,omitempty"`
	Hot   []int `json:"hot,omitempty"`
	// Skipped: no target was running.
	Skipped bool `json:"skipped,omitempty"`
	// NewLeaderSeconds (kill_stream_leader): from the kill to AURORA_OUTBOX
	// reporting a leader on another node; -1 when none within 30 s.
	NewLeaderSeconds float64 `json:"new_leader_seconds,omitempty"`
}

const sigCont = syscall.SIGCONT

// waitPending waits for every scheduled restart and SIGCONT to have run.
func (r *run) waitPending() { r.recoveries.Wait() }

func (r *run) faultList() []Fault {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Fault(nil), r.faults...)
}

// inject runs the schedule until it ends or ctx does. With
// Options.OverlapFaults each fault fires at its planned time in its own
// goroutine; inject returns when every one has fired.
func (r *run) inject(ctx context.Context, sched []Planned) {
	start := time.Now()
	var firing sync.WaitGroup
	defer firing.Wait()
	for _, pl := range sched {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(start.Add(pl.At))):
		}
		if !r.o.OverlapFaults {
			r.record(r.fire(ctx, pl))
			continue
		}
		firing.Add(1)
		go func(pl Planned) {
			defer firing.Done()
			r.record(r.fire(ctx, pl))
		}(pl)
	}
}

// record appends an injected (or skipped) fault to the run's list.
func (r *run) record(f Fault) {
	r.mu.Lock()
	r.faults = append(r.faults, f)
	r.mu.Unlock()
}

// fire injects one fault and schedules its recovery. A fault whose kind
// finds no target running (every deliverer down or stopped, the relays
// down, Postgres or NATS already down) waits for one, up to 10 s, before
// it is skipped.
func (r *run) fire(ctx context.Context, pl Planned) Fault {
	f := Fault{Planned: pl, Start: time.Now()}
	if pl.Kind == FaultStopLong {
		f.Down += time.Duration(r.o.LeaseSeconds) * time.Second
	}
	if pl.Kind == FaultDeleteConsumer {
		n, err := r.deleteConsumers(ctx)
		if err != nil || n == 0 {
			f.Skipped = true
			r.logf("fault %s skipped: %d consumers deleted (%v)", pl.Kind, n, err)
			return f
		}
		f.Target = fmt.Sprintf("%d consumers of %s", n, outbox.StreamName)
		r.logf("fault %s: %s", pl.Kind, f.Target)
		return f
	}
	targets := r.choose(ctx, pl, &f)
	for wait := time.Now().Add(10 * time.Second); len(targets) == 0 && time.Now().Before(wait) && ctx.Err() == nil; {
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
		targets = r.choose(ctx, pl, &f)
	}
	if len(targets) == 0 {
		f.Skipped = true
		r.logf("fault %s skipped: no target running", pl.Kind)
		return f
	}
	var names []string
	for _, t := range targets {
		names = append(names, t.name)
	}
	f.Target = strings.Join(names, ",")
	stop := pl.Kind == FaultStopCont || pl.Kind == FaultStopLong || pl.Kind == FaultFreezeNATS
	f.Start = time.Now()
	var hit []*proc
	for _, t := range targets {
		var err error
		if stop {
			err = t.signal(syscall.SIGSTOP)
		} else {
			err = t.kill9()
		}
		if err == nil {
			hit = append(hit, t)
		}
	}
	if len(hit) == 0 {
		f.Skipped = true
		return f
	}
	if pl.Kind == FaultKillStreamLeader {
		// measured aside, so the schedule does not wait for the election
		r.recoveries.Add(1)
		go func(start time.Time) {
			defer r.recoveries.Done()
			s := r.awaitLeader(ctx, hit[0], start)
			for try := 0; try < 50; try++ { // the fault is recorded when fire returns
				r.mu.Lock()
				for i := range r.faults {
					if r.faults[i].Kind == FaultKillStreamLeader && r.faults[i].Start.Equal(start) {
						r.faults[i].NewLeaderSeconds = s
						r.mu.Unlock()
						return
					}
				}
				r.mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		}(f.Start)
	}
	r.logf("fault %s on %s (hot partitions %v), back in %s", pl.Kind, f.Target, f.Hot, f.Down.Round(time.Millisecond))
	r.recoveries.Add(1)
	time.AfterFunc(f.Down, func() {
		defer r.recoveries.Done()
		for _, t := range hit {
			if stop {
				_ = t.signal(syscall.SIGCONT)
				continue
			}
			if t.current() == procDown {
				if err := t.start(); err != nil && t.current() == procDown {
					r.logf("restart %s: %v", t.name, err)
				}
			}
		}
	})
	return f
}

// deleteConsumers deletes every consumer of AURORA_OUTBOX and returns how
// many it deleted.
func (r *run) deleteConsumers(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := r.js.Stream(ctx, outbox.StreamName)
	if err != nil {
		return 0, err
	}
	names := s.ConsumerNames(ctx)
	var all []string
	for n := range names.Name() {
		all = append(all, n)
	}
	if err := names.Err(); err != nil {
		return 0, err
	}
	n := 0
	for _, c := range all {
		if err := s.DeleteConsumer(ctx, c); err == nil {
			n++
		}
	}
	return n, nil
}

// choose returns the targets of pl now (none when none is running) and
// notes in f what a deliverer target owned.
func (r *run) choose(ctx context.Context, pl Planned, f *Fault) []*proc {
	one := func(p *proc) []*proc {
		if p == nil {
			return nil
		}
		return []*proc{p}
	}
	switch pl.Kind {
	case FaultKillRelay:
		return one(pickRunning(r.relays, pl.Pick))
	case FaultKillPostgres:
		if r.pg.proc.current() == procRunning {
			return one(r.pg.proc)
		}
		return nil
	case FaultRestartNATS, FaultFreezeNATS:
		var up []*proc
		for _, n := range r.nats.nodes {
			if n.current() == procRunning {
				up = append(up, n)
			}
		}
		if len(up) < len(r.nats.nodes) {
			return nil // a node is already down or stopped: wait for the whole cluster
		}
		return up
	case FaultKillStreamLeader, FaultKillStreamFollower:
		return one(r.streamNode(ctx, pl.Kind == FaultKillStreamLeader, pl.Pick))
	case FaultKillConsumer, FaultKillReconciler:
		return one(r.chooseEvents(pl))
	case FaultKillInbox:
		return one(r.pickInbox(pl.Pick))
	case FaultKillOwner, FaultStopLong:
		// The owner of the most hot partitions (stop_long: so that it
		// holds leases when it is stopped); while a take-over is under way
		// nobody may own them yet: wait for one (a bounded while), so the
		// faults hit owners, repeatedly.
		waitUntil := time.Now().Add(time.Duration(r.o.PinnedTTLSeconds)*time.Second + 10*time.Second)
		for {
			owners := r.owners(ctx)
			best, bestHot := -1, -1
			for i, p := range r.dels {
				if p.current() != procRunning {
					continue
				}
				if h := len(r.hotOf(owners[i])); h > bestHot {
					best, bestHot = i, h
				}
			}
			if best >= 0 && (bestHot > 0 || time.Now().After(waitUntil)) {
				f.Owned, f.Hot = owners[best], r.hotOf(owners[best])
				return one(r.dels[best])
			}
			if best < 0 && time.Now().After(waitUntil) || ctx.Err() != nil {
				return nil
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	case FaultKillDeliverer, FaultStopCont:
		var up []int
		for i, p := range r.dels {
			if p.current() == procRunning {
				up = append(up, i)
			}
		}
		if len(up) > 0 {
			idx := up[int(pl.Pick*float64(len(up)))]
			owners := r.owners(ctx)
			f.Owned, f.Hot = owners[idx], r.hotOf(owners[idx])
			return one(r.dels[idx])
		}
	}
	return nil
}

// pickRunning returns the running process of ps that pick (in [0, 1))
// selects, nil when none runs.
func pickRunning(ps []*proc, pick float64) *proc {
	var up []*proc
	for _, p := range ps {
		if p.current() == procRunning {
			up = append(up, p)
		}
	}
	if len(up) == 0 {
		return nil
	}
	return up[int(pick*float64(len(up)))]
}

// awaitLeader polls AURORA_OUTBOX's stream info until a node other than
// old leads it, and returns the seconds since killed; -1 after 30 s.
func (r *run) awaitLeader(ctx context.Context, old *proc, killed time.Time) float64 {
	for time.Since(killed) < 30*time.Second && ctx.Err() == nil {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		s, err := r.js.Stream(sctx, outbox.StreamName)
		if err == nil {
			var info *jetstream.StreamInfo
			if info, err = s.Info(sctx); err == nil && info.Cluster != nil && info.Cluster.Leader != "" && r.nats.node(info.Cluster.Leader) != old {
				cancel()
				return time.Since(killed).Seconds()
			}
		}
		cancel()
		time.Sleep(100 * time.Millisecond)
	}
	return -1
}

// streamNode returns the running nats-server leading AURORA_OUTBOX
// (leader) or one of its running followers (picked by pick), nil when the
// cluster does not say (no leader now, or a single node).
func (r *run) streamNode(ctx context.Context, leader bool, pick float64) *proc {
	if len(r.nats.nodes) < 2 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := r.js.Stream(ctx, outbox.StreamName)
	if err != nil {
		return nil
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
		return nil
	}
	if leader {
		if p := r.nats.node(info.Cluster.Leader); p != nil && p.current() == procRunning {
			return p
		}
		return nil
	}
	var up []*proc
	for _, peer := range info.Cluster.Replicas {
		if p := r.nats.node(peer.Name); p != nil && p.current() == procRunning && peer.Current {
			up = append(up, p)
		}
	}
	if len(up) == 0 {
		return nil
	}
	return up[int(pick*float64(len(up)))]
}

// hotOf returns the partitions of parts that carry a hot tenant's lane.
func (r *run) hotOf(parts []int) []int {
	hot := map[int]bool{}
	for _, t := range r.hot {
		hot[r.partitions[t]] = true
	}
	var out []int
	for _, p := range parts {
		if hot[p] {
			out = append(out, p)
		}
	}
	return out
}

// owners asks every running deliverer's /metrics which partitions it
// owns (aurora_deliverer_partition_owned{partition} 1), by deliverer index.
// A deliverer that does not answer within 500 ms owns nothing here.
func (r *run) owners(ctx context.Context) map[int][]int {
	out := map[int][]int{}
	for i, addr := range r.delHTTP {
		if r.dels[i].current() != procRunning {
			continue
		}
		out[i] = scrapeOwned(ctx, "http://"+addr+"/metrics")
	}
	return out
}

// scrapeOwned reads the partitions a deliverer's metrics say it owns.
func scrapeOwned(ctx context.Context, url string) []int {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	return parseOwned(bufio.NewScanner(resp.Body))
}

// parseOwned parses Prometheus text lines
// aurora_deliverer_partition_owned{partition="N"} V and returns the N with
// V = 1, sorted.
func parseOwned(sc *bufio.Scanner) []int {
	const prefix = `aurora_deliverer_partition_owned{partition="`
	var out []int
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		num, val, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		p, err := strconv.Atoi(num)
		if err != nil {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil && v == 1 {
			out = append(out, p)
		}
	}
	sort.Ints(out)
	return out
}
