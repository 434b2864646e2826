package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/aurora-billing/aurora/shared/jsapi"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// consumerConfig is the durable JetStream consumer of one events consumer:
// its types' subjects, explicit acks, AckWait and MaxDeliver from Config,
// and only messages stored after it was first created (what was dispatched
// earlier and is not yet acknowledged reaches it through catch-up).
func consumerConfig(name string, types []string, cfg Config) jetstream.ConsumerConfig {
	subjects := make([]string, len(types))
	for i, t := range types {
		subjects[i] = Subject(t)
	}
	return jetstream.ConsumerConfig{
		Durable:        name,
		Description:    "aurora events consumer " + name,
		FilterSubjects: subjects,
		DeliverPolicy:  jetstream.DeliverNewPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        cfg.ackWait(),
		MaxDeliver:     cfg.ConsumerMaxDeliver,
		MaxAckPending:  256,
	}
}

// realtime consumes the durable JetStream consumer until ctx ends,
// re-attaching after the consumer or the connection went away, and handles
// JetStream's MAX_DELIVERIES advisories for it.
func (w *worker) realtime(ctx context.Context) {
	advisory := fmt.Sprintf("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.%s.%s", StreamName, w.name)
	sub, err := w.c.js.Conn().Subscribe(advisory, func(m *nats.Msg) { w.onMaxDeliveries(ctx, m) })
	if err != nil {
		w.log.Warn("events: subscribe to MAX_DELIVERIES advisories failed; dead letters from it rely on the next start", "err", err)
	} else {
		defer sub.Unsubscribe() //nolint:errcheck
	}
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := w.consumeOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrStreamConfig) {
			w.log.Error("events: JetStream refused the consumer; real-time delivery off, catch-up continues", "err", err)
			<-ctx.Done()
			return
		}
		w.log.Warn("events: real-time consumer stopped, re-attaching", "err", err, "retry_in", delay)
		if !sleep(ctx, delay) {
			return
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func (w *worker) consumeOnce(ctx context.Context) error {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cons, err := w.c.js.CreateOrUpdateConsumer(actx, StreamName, consumerConfig(w.name, w.types, w.c.cfg))
	cancel()
	if err != nil {
		var apiErr *jetstream.APIError
		switch {
		case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamNotFound:
			_, _ = EnsureStream(ctx, w.c.js, w.c.cfg) // the stream was deleted: make it again
		case jsapi.Refused(err): // a 5xx (no leader, no quorum) is retried
			return fmt.Errorf("%w: consumer %s: %w", ErrStreamConfig, w.name, err)
		}
		return err
	}
	stopped := make(chan error, 1)
	cc, err := cons.Consume(func(m jetstream.Msg) { w.onMessage(ctx, m) },
		jetstream.PullMaxMessages(16),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
				select {
				case stopped <- err:
				default:
				}
			}
		}))
	if err != nil {
		return err
	}
	defer cc.Stop()
	select {
	case <-ctx.Done():
		cc.Drain()
		<-cc.Closed()
		return nil
	case err := <-stopped:
		return err
	case <-cc.Closed():
		return errors.New("events: consume context closed")
	}
}

// onMessage processes one JetStream message and answers it: ack when the
// event is processed, a duplicate or nothing to do; term when it is
// dead-lettered; nak with the retry delay after a failure.
func (w *worker) onMessage(ctx context.Context, m jetstream.Msg) {
	id := m.Headers().Get(jetstream.MsgIDHeader)
	if !ValidID(id) {
		w.log.Error("events: message without a valid Nats-Msg-Id; terminated", "subject", m.Subject())
		_ = m.Term()
		return
	}
	o, wait, err := w.process(ctx, id, SourceRealtime, func() { _ = m.InProgress() })
	if err != nil {
		if ctx.Err() != nil {
			return // redelivered after AckWait
		}
		w.c.m.failures.WithLabelValues(w.name, "claim").Inc()
		w.log.Warn("events: claim failed, message will be redelivered", "event_id", id, "err", err)
		_ = m.NakWithDelay(msDur(w.c.cfg.ConsumerBackoffBaseMS))
		return
	}
	w.count(o, SourceRealtime)
	switch o {
	case outProcessed, outDuplicate, outSkipped:
		_ = m.Ack()
	case outDeadLettered:
		_ = m.TermWithReason("dead-lettered for consumer")
	case outFailed, outNotDue:
		_ = m.NakWithDelay(max(wait, 10*time.Millisecond))
	}
}

// onMaxDeliveries dead-letters the event JetStream gave up on (a handler
// that kills its process never records its own failure).
func (w *worker) onMaxDeliveries(ctx context.Context, m *nats.Msg) {
	var adv struct {
		StreamSeq  uint64 `json:"stream_seq"`
		Deliveries uint64 `json:"deliveries"`
	}
	if err := json.Unmarshal(m.Data, &adv); err != nil || adv.StreamSeq == 0 {
		w.log.Warn("events: unreadable MAX_DELIVERIES advisory", "err", err)
		return
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := w.c.js.Stream(actx, StreamName)
	if err != nil {
		w.log.Warn("events: MAX_DELIVERIES advisory: stream lookup failed", "stream_seq", adv.StreamSeq, "err", err)
		return
	}
	raw, err := s.GetMsg(actx, adv.StreamSeq)
	if err != nil {
		w.log.Warn("events: MAX_DELIVERIES advisory: message lookup failed", "stream_seq", adv.StreamSeq, "err", err)
		return
	}
	id := raw.Header.Get(jetstream.MsgIDHeader)
	if !ValidID(id) {
		return
	}
	detail := fmt.Sprintf("JetStream delivered it %d times without an ack", adv.Deliveries)
	if err := w.deadLetter(actx, id, ReasonMaxDeliveries, detail); err != nil {
		w.log.Warn("events: MAX_DELIVERIES advisory: dead letter failed", "event_id", id, "err", err)
	}
}
