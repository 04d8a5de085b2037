package queue

import (
	"context"
	"encoding/json"
	"fmt"
)

// A Codec turns values into payloads and back.
type Codec interface {
	// Marshal encodes v as a job's payload or answer.
	Marshal(v any) ([]byte, error)
	// Unmarshal decodes data into v, a pointer.
	Unmarshal(data []byte, v any) error
}

// jsonCodec is the [Codec] of encoding/json, a nil Codec's.
type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// Typed puts request and response types on a queue's byte payloads: its
// Handler wraps a typed handler for [Config.Handler], and its Submit and
// Enqueue encode the request and decode the answer. The zero value uses
// encoding/json. A Typed holds no state; it is safe for simultaneous use.
//
//	var buys queue.Typed[Buy, Answer]
//	q, err := queue.New(queue.Config{Partitions: 16, Handler: buys.Handler(sell)})
//	answer, err := buys.Submit(ctx, q, "sku-1", Buy{Qty: 1})
type Typed[Req, Resp any] struct {
	// Codec encodes requests and responses. Default: nil, encoding/json
	// (json.Marshal and json.Unmarshal).
	Codec Codec
}

func (t Typed[Req, Resp]) codec() Codec {
	if t.Codec == nil {
		return jsonCodec{}
	}
	return t.Codec
}

// Handler returns a [Handler] that decodes each job's payload into a Req,
// calls h, and encodes its Resp. A payload that does not decode is an error
// that no redelivery can fix: mark it so with [Config.Retryable] if it should
// go straight to the dead letters.
func (t Typed[Req, Resp]) Handler(h func(ctx context.Context, key string, req Req) (Resp, error)) Handler {
	c := t.codec()
	return func(ctx context.Context, job Job) ([]byte, error) {
		var req Req
		if err := c.Unmarshal(job.Payload, &req); err != nil {
			return nil, fmt.Errorf("queue: decode job for %s: %w", job.Key, err)
		}
		resp, err := h(ctx, job.Key, req)
		if err != nil {
			return nil, err
		}
		return c.Marshal(resp)
	}
}

// Submit encodes req, submits it to q (either backend) for key, and decodes
// the answer: see [Queue.Submit].
func (t Typed[Req, Resp]) Submit(ctx context.Context, q Backend, key string, req Req) (Resp, error) {
	var resp Resp
	c := t.codec()
	payload, err := c.Marshal(req)
	if err != nil {
		return resp, fmt.Errorf("queue: encode job for %s: %w", key, err)
	}
	out, err := q.Submit(ctx, key, payload)
	if err != nil {
		return resp, err
	}
	if err := c.Unmarshal(out, &resp); err != nil {
		return resp, fmt.Errorf("queue: decode answer for %s: %w", key, err)
	}
	return resp, nil
}

// Enqueue encodes req and enqueues it to q for key: see [Queue.Enqueue].
func (t Typed[Req, Resp]) Enqueue(ctx context.Context, q Backend, key string, req Req) error {
	payload, err := t.codec().Marshal(req)
	if err != nil {
		return fmt.Errorf("queue: encode job for %s: %w", key, err)
	}
	return q.Enqueue(ctx, key, payload)
}
