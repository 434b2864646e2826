package deliverer

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/nats-io/nats.go/jetstream"
)

type laneMsg struct {
	jetstream.Msg // nil: lanes only store and return messages
	item          int64
}

func TestLaneKey(t *testing.T) {
	t.Parallel()
	lane := outbox.Lane("acct_1", "cus_1", "mtr_1")
	cases := []struct {
		name    string
		subject string
		m       outbox.Message
		want    string
	}{
		{"lane token", "aurora.outbox.x.org_1.3", outbox.Message{Lane: lane, Feature: "f"}, lane},
		{"older relay: subject and feature", "aurora.outbox.x.org_1", outbox.Message{Feature: "f"}, "aurora.outbox.x.org_1|f"},
	}
	for _, c := range cases {
		if got := laneKey(c.subject, c.m); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestLanesShareAndGroups: the first message of a lane starts it; later ones
// queue while the lane holds less than its share, then are deferred, each a
// little later than the one before; groups come out oldest first, at most
// the limit, and the lane closes when empty.
func TestLanesShareAndGroups(t *testing.T) {
	t.Parallel()
	l := newLanes(3)
	m := func(i int64) laneMsg { return laneMsg{item: i} }
	if mode, _ := l.join("a", m(1), 1); mode != laneOwner {
		t.Fatalf("first: %v", mode)
	}
	if mode, _ := l.join("b", m(9), 9); mode != laneOwner {
		t.Fatalf("another lane: %v", mode)
	}
	for i := int64(2); i <= 3; i++ {
		if mode, _ := l.join("a", m(i), i); mode != laneQueued {
			t.Fatalf("message %d: %v", i, mode)
		}
	}
	mode, d1 := l.join("a", m(4), 4)
	_, d2 := l.join("a", m(5), 5)
	if mode != laneOverflow || d1 <= 0 || d2 <= d1 || d2 > maxDeferral {
		t.Fatalf("over the share: %v, delays %s then %s", mode, d1, d2)
	}
	if !l.push("a", m(6)) || l.push("zzz", m(7)) {
		t.Fatal("push onto a running lane must queue; onto no lane must refuse")
	}
	g, _ := l.nextGroup("a", 2)
	if len(g) != 2 || g[0].(laneMsg).item != 2 || g[1].(laneMsg).item != 3 {
		t.Fatalf("group %v", g)
	}
	if g, _ := l.nextGroup("a", 2); len(g) != 1 || g[0].(laneMsg).item != 6 {
		t.Fatalf("second group %v", g)
	}
	if g, _ := l.nextGroup("a", 2); g != nil {
		t.Fatalf("empty lane returned %v", g)
	}
	if mode, _ := l.join("a", m(8), 8); mode != laneOwner {
		t.Fatalf("after closing: %v", mode)
	}
	if left := l.drainAll(); len(left) != 0 {
		t.Fatalf("drainAll returned queued %v", left)
	}
}

// TestLaneDeferralFollowsMeasuredPace: the deferral delay grows with what
// the lane holds times its measured time per item.
func TestLaneDeferralFollowsMeasuredPace(t *testing.T) {
	t.Parallel()
	l := newLanes(2)
	l.observe("a", time.Second, 10) // 100 ms an item
	l.join("a", laneMsg{item: 1}, 1)
	l.join("a", laneMsg{item: 2}, 2)
	_, d := l.join("a", laneMsg{item: 3}, 3)
	// holds 2 → 2×100 ms, plus its own turn
	if d < 250*time.Millisecond || d > 350*time.Millisecond {
		t.Fatalf("delay %s, want about 300ms", d)
	}
}

// TestLaneRecall: a lane remembers what it deferred and, once it holds no
// more than half its share, hands back up to its free room of them, oldest
// first; a closed lane parks the rest for its next runner; a deferral
// noted after the lane closed is recalled at once.
func TestLaneRecall(t *testing.T) {
	t.Parallel()
	l := newLanes(4)
	m := func(i int64) laneMsg { return laneMsg{item: i} }
	l.join("a", m(1), 1)
	for i := int64(2); i <= 4; i++ {
		l.join("a", m(i), i)
	}
	for i := int64(5); i <= 10; i++ {
		if mode, _ := l.join("a", m(i), i); mode != laneOverflow {
			t.Fatalf("message %d: %v", i, mode)
		}
		// holds 4 of a share of 4: nothing to recall yet
		if r := l.remember("a", deferredItem{ID: i, Dispatch: 2}); r != nil {
			t.Fatalf("recall while full: %v", r)
		}
	}
	ids := func(r []deferredItem) (out []int64) {
		for _, it := range r {
			out = append(out, it.ID)
		}
		return out
	}
	// takes 2 of 3 queued: holds 3 > 4/2, no recall
	if g, r := l.nextGroup("a", 2); len(g) != 2 || r != nil {
		t.Fatalf("group %d, recall %v", len(g), ids(r))
	}
	// takes the last one: holds 1, room for 3
	g, r := l.nextGroup("a", 2)
	if len(g) != 1 || !slices.Equal(ids(r), []int64{5, 6, 7}) {
		t.Fatalf("group %d, recall %v", len(g), ids(r))
	}
	// the lane empties with 8, 9, 10 still deferred: recalled (room 4), lane closed
	if g, r := l.nextGroup("a", 2); g != nil || !slices.Equal(ids(r), []int64{8, 9, 10}) {
		t.Fatalf("closing: group %v, recall %v", g, ids(r))
	}
	if r := l.remember("a", deferredItem{ID: 11, Dispatch: 2}); !slices.Equal(ids(r), []int64{11}) {
		t.Fatalf("deferral noted after the lane closed: %v", ids(r))
	}

	// more deferred than the share when the lane closes: the rest is parked
	l2 := newLanes(2)
	l2.join("b", m(1), 1)
	l2.join("b", m(2), 2)
	for i := int64(3); i <= 7; i++ {
		l2.join("b", m(i), i)
		l2.remember("b", deferredItem{ID: i, Dispatch: 2})
	}
	if _, r := l2.nextGroup("b", 5); r != nil { // holds 1 (running) of 2: half, room 1
		if !slices.Equal(ids(r), []int64{3}) {
			t.Fatalf("recall %v", ids(r))
		}
	}
	if g, r := l2.nextGroup("b", 5); g != nil || !slices.Equal(ids(r), []int64{4, 5}) {
		t.Fatalf("closing: %v %v", g, ids(r))
	}
	if got := ids(l2.parked["b"]); !slices.Equal(got, []int64{6, 7}) {
		t.Fatalf("parked %v", got)
	}
	l2.join("b", m(4), 4) // a recalled message starts the lane again: it inherits 6, 7
	if g, r := l2.nextGroup("b", 5); g != nil || !slices.Equal(ids(r), []int64{6, 7}) {
		t.Fatalf("inherited: %v %v", g, ids(r))
	}
}

// TestLaneAdoption: a lane is adopted once per process, not at all when
// this process deferred for it; adopted items join its memory and are
// recalled like its own, or are parked when the lane has closed.
func TestLaneAdoption(t *testing.T) {
	t.Parallel()
	l := newLanes(4)
	if !l.firstAdoption("a") || l.firstAdoption("a") {
		t.Fatal("a lane must be adopted exactly once")
	}
	l.join("b", laneMsg{item: 1}, 1)
	l.remember("b", deferredItem{ID: 9, Dispatch: 2})
	if l.firstAdoption("b") {
		t.Fatal("a lane this process deferred for is not adopted")
	}
	l.join("c", laneMsg{item: 1}, 1) // holds 1 of 4: room for 3
	r := l.adoptDeferred("c", []deferredItem{{ID: 5, Dispatch: 2}, {ID: 6, Dispatch: 2}, {ID: 7, Dispatch: 2}, {ID: 8, Dispatch: 2}})
	if len(r) != 3 || r[0].ID != 5 || r[2].ID != 7 {
		t.Fatalf("recalled %+v, want 5, 6, 7", r)
	}
	if r := l.adoptDeferred("gone", []deferredItem{{ID: 1, Dispatch: 2}}); r != nil || len(l.parked["gone"]) != 1 {
		t.Fatalf("closed lane: recall %v, parked %v", r, l.parked["gone"])
	}
}

// bodyMsg is a message with a body and nothing else.
type bodyMsg struct {
	jetstream.Msg
	body []byte
}

func (b bodyMsg) Data() []byte { return b.body }

func TestDecodeMsgDecodesOnce(t *testing.T) {
	t.Parallel()
	good := outbox.Message{ItemID: 7, Key: strings.Repeat("a", 64), Dispatch: 2}
	tests := []struct {
		name string
		msg  jetstream.Msg
		want outbox.Message
		err  error
	}{
		{name: "raw body decoded", msg: bodyMsg{body: good.Encode()}, want: good},
		{name: "raw bad body", msg: bodyMsg{body: []byte("{")}, err: outbox.ErrBadMessage},
		// onMessage's decoded body is used as is: the raw body is not read again.
		{name: "decoded by onMessage", msg: decodedMsg{Msg: bodyMsg{body: []byte("not json")}, m: good}, want: good},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m, err := decodeMsg(tt.msg)
			if !errors.Is(err, tt.err) || m != tt.want {
				t.Fatalf("decodeMsg = %+v, %v; want %+v, %v", m, err, tt.want, tt.err)
			}
		})
	}
}
