package deliverer

import (
	"context"
	"sync"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A batch message (outbox.HeaderBatch) carries several items of one
// partition. The deliverer splits it into one item message per entry
// (itemMsg), each with the subject and body its own message would have had,
// so lanes, claims and outcomes are exactly those of single messages. The
// JetStream message is settled once, when its last item settles:
//
//	every item Ack or Term      → Ack
//	any item Nak / NakWithDelay → NakWithDelay(the longest delay asked; Nak when 0)
//
// A redelivered batch brings back every item, the settled ones too; their
// claims find them handled (terminal, or another dispatch) and they are
// terminated again at the cost of one claim each. InProgress on any item
// is passed on at most once per inProgressEvery, which keeps the message
// alive while its slowest lane works (the lanes heartbeat every third of
// the ack wait).

// inProgressEvery bounds how often a batch message's items pass their
// heartbeats on to JetStream.
const inProgressEvery = time.Second

// batchMsg is the JetStream message of a batch and what its items asked.
type batchMsg struct {
	msg jetstream.Msg

	mu        sync.Mutex
	pending   int           // items not settled yet
	redeliver bool          // some item asked for a redelivery
	delay     time.Duration // the longest delay asked
	beat      time.Time     // the last InProgress passed on
}

// settle records one item's settlement; the last one settles msg and
// returns what JetStream answered.
func (b *batchMsg) settle(redeliver bool, delay time.Duration) error {
	b.mu.Lock()
	b.pending--
	if redeliver {
		b.redeliver = true
		b.delay = max(b.delay, delay)
	}
	last, again, d := b.pending == 0, b.redeliver, b.delay
	b.mu.Unlock()
	switch {
	case !last:
		return nil
	case !again:
		return b.msg.Ack()
	case d > 0:
		return b.msg.NakWithDelay(d)
	default:
		return b.msg.Nak()
	}
}

// inProgress passes a heartbeat on unless one went out within
// inProgressEvery.
func (b *batchMsg) inProgress(now time.Time) error {
	b.mu.Lock()
	send := now.Sub(b.beat) >= inProgressEvery
	if send {
		b.beat = now
	}
	b.mu.Unlock()
	if !send {
		return nil
	}
	return b.msg.InProgress()
}

// itemMsg is one item of a batch message, seen by the deliverer as a
// message of its own. Its first settlement counts; a second returns
// jetstream.ErrMsgAlreadyAckd, as a message's would.
type itemMsg struct {
	batch   *batchMsg
	subject string
	data    []byte
	header  nats.Header
	once    sync.Once
}

var _ jetstream.Msg = (*itemMsg)(nil)

func (m *itemMsg) Metadata() (*jetstream.MsgMetadata, error) { return m.batch.msg.Metadata() }
func (m *itemMsg) Data() []byte                              { return m.data }
func (m *itemMsg) Headers() nats.Header                      { return m.header }
func (m *itemMsg) Subject() string                           { return m.subject }
func (m *itemMsg) Reply() string                             { return m.batch.msg.Reply() }
func (m *itemMsg) Ack() error                                { return m.settle(false, 0) }
func (m *itemMsg) DoubleAck(context.Context) error           { return m.settle(false, 0) }
func (m *itemMsg) Nak() error                                { return m.settle(true, 0) }
func (m *itemMsg) NakWithDelay(d time.Duration) error        { return m.settle(true, d) }
func (m *itemMsg) Term() error                               { return m.settle(false, 0) }
func (m *itemMsg) TermWithReason(string) error               { return m.settle(false, 0) }
func (m *itemMsg) InProgress() error                         { return m.batch.inProgress(time.Now()) }

func (m *itemMsg) settle(redeliver bool, delay time.Duration) error {
	var err error = jetstream.ErrMsgAlreadyAckd
	m.once.Do(func() { err = m.batch.settle(redeliver, delay) })
	return err
}

// splitBatch returns the item messages of a batch message, how many of
// its entries were bad (outbox.BatchEntry.Validate refused them; they are
// settled as terminated, so they never hold the batch back) and the first
// refusal (outbox.ErrBadMessage wrapped; it names no field value). ok is
// false when msg is not a batch message. A body that is not a batch at all
// is returned as (nil, 0, its error, true): the caller terminates msg.
func splitBatch(msg jetstream.Msg) (items []jetstream.Msg, bad int, why error, ok bool) {
	h := msg.Headers()
	if h.Get(outbox.HeaderBatch) == "" {
		return nil, 0, nil, false
	}
	b, err := outbox.DecodeBatch(msg.Data())
	if err != nil {
		return nil, 0, err, true
	}
	header := make(nats.Header, len(h))
	for k, v := range h {
		if k != outbox.HeaderBatch {
			header[k] = v
		}
	}
	parent := &batchMsg{msg: msg, pending: len(b.Items)}
	items = make([]jetstream.Msg, 0, len(b.Items))
	for _, e := range b.Items {
		im := &itemMsg{batch: parent, subject: e.Subject, data: e.Message.Encode(), header: header}
		if err := e.Validate(); err != nil {
			bad++
			if why == nil {
				why = err
			}
			_ = im.Term()
			continue
		}
		items = append(items, im)
	}
	return items, bad, why, true
}
