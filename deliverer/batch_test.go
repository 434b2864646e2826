package deliverer

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// call is a test batch call: the item ids it carries.
type call []int64

func callIDs(c call) []int64 { return c }

func TestGather(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		first        call
		queued       []call // waiting on the channel when gather starts (not with late)
		late         []call // sent while gather lingers; then the linger fires
		linger       bool
		limit        int
		batch, later []call
	}{
		{name: "idle: first alone", first: call{1}, limit: 100, batch: []call{{1}}},
		{name: "queued calls join", first: call{1}, queued: []call{{2, 3}, {4}}, limit: 100, batch: []call{{1}, {2, 3}, {4}}},
		{name: "full at the limit", first: call{1, 2}, queued: []call{{3, 4}, {5}}, limit: 4, batch: []call{{1, 2}, {3, 4}}},
		{name: "a call is never split", first: call{1, 2, 3}, queued: []call{{4, 5}}, limit: 4, batch: []call{{1, 2, 3}, {4, 5}}},
		{name: "same item twice: later", first: call{1}, queued: []call{{2, 1}, {3}}, limit: 100, batch: []call{{1}, {3}}, later: []call{{2, 1}}},
		{name: "linger: late calls join until it fires", first: call{1}, late: []call{{2}, {3}, {4, 5}}, linger: true,
			limit: 100, batch: []call{{1}, {2}, {3}, {4, 5}}},
		{name: "linger: ends when the batch is full", first: call{1}, late: []call{{2}, {3}}, linger: true, limit: 2,
			batch: []call{{1}, {2}}},
		{name: "linger: same item twice still later", first: call{1}, late: []call{{1}, {2}}, linger: true, limit: 100,
			batch: []call{{1}, {2}}, later: []call{{1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if len(tt.queued) > 0 && len(tt.late) > 0 {
				t.Fatal("a case has queued or late calls, not both: late sends must find the channel unbuffered")
			}
			ch := make(chan call, len(tt.queued))
			for _, c := range tt.queued {
				ch <- c
			}
			var linger chan time.Time
			if tt.linger {
				linger = make(chan time.Time)
			}
			done := make(chan struct{})
			var batch, later []call
			go func() {
				defer close(done)
				if linger == nil {
					batch, later = gather(tt.first, ch, tt.limit, callIDs, nil)
					return
				}
				batch, later = gather(tt.first, ch, tt.limit, callIDs, linger)
			}()
			// The channel is unbuffered when there are late calls, so each
			// send completes only when gather takes it (or gather has
			// returned: a full batch); the linger fires after the last.
			for _, c := range tt.late {
				select {
				case ch <- c:
				case <-done:
				}
			}
			if linger != nil {
				select {
				case linger <- time.Time{}:
				case <-done:
				}
			}
			<-done
			if !slices.EqualFunc(batch, tt.batch, slices.Equal) || !slices.EqualFunc(later, tt.later, slices.Equal) {
				t.Fatalf("batch %v later %v; want %v and %v", batch, later, tt.batch, tt.later)
			}
		})
	}
}

func TestLingererOnlyWhenBusy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		d      time.Duration
		ran    []int // batch sizes (calls) before next
		others int32 // runners of the kind running a statement
		linger bool
	}{
		{name: "first batch: idle", d: time.Hour, linger: false},
		{name: "after a batch of one call", d: time.Hour, ran: []int{3, 1}, linger: false},
		{name: "after a batch of several calls", d: time.Hour, ran: []int{1, 2}, linger: true},
		{name: "off (0)", d: 0, ran: []int{5}, linger: false},
		{name: "one call, the other runner running a statement", d: time.Hour, ran: []int{1}, others: 1, linger: true},
		{name: "off (0) while the other runs", d: 0, ran: []int{1}, others: 1, linger: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var executing atomic.Int32
			executing.Store(tt.others)
			l := lingerer{d: tt.d, executing: &executing}
			for _, n := range tt.ran {
				l.ran(n)
			}
			if got := l.next() != nil; got != tt.linger {
				t.Fatalf("lingers = %v, want %v", got, tt.linger)
			}
		})
	}
	// The timer is reused and restarted for each busy batch.
	l := lingerer{d: time.Millisecond}
	l.ran(2)
	first := l.next()
	<-first
	l.ran(2)
	if second := l.next(); second != first {
		t.Fatal("a new timer for each batch; want the runner's one timer restarted")
	} else if _, ok := <-second; !ok {
		t.Fatal("restarted timer closed")
	}
}
