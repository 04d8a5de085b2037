package contend

import (
	"context"
	"log/slog"
)

// SlogObserver returns an [Observer] that writes every event to logger, as
// one record with the message "contend: " and the event's kind, and the
// attributes strategy, key, and those of wait, hold, attempts, fence and
// err that are set. Events of a hold going well or a race lost (obtained,
// conflict, retry, gave-up, released) are logged at level; those that may
// need a person (lost, failed, dead-lettered) at level or [slog.LevelWarn],
// whichever is higher. A nil logger means [slog.Default]. Records below the
// logger's level cost one Enabled call.
//
//	cfg := distlock.Config{Observer: contend.SlogObserver(logger, slog.LevelDebug)}
func SlogObserver(logger *slog.Logger, level slog.Level) Observer {
	if logger == nil {
		logger = slog.Default()
	}
	return slogObserver{logger: logger, level: level}
}

type slogObserver struct {
	logger *slog.Logger
	level  slog.Level
}

var slogMessages = func() (m [len(eventKinds)]string) {
	for k, name := range eventKinds {
		m[k] = "contend: " + name
	}
	return m
}()

func (o slogObserver) Observe(ctx context.Context, e Event) {
	level := o.level
	switch e.Kind {
	case EventLost, EventFailed, EventDeadLettered:
		level = max(level, slog.LevelWarn)
	}
	if !o.logger.Enabled(ctx, level) {
		return
	}
	msg := "contend: " + e.Kind.String()
	if int(e.Kind) < len(slogMessages) && slogMessages[e.Kind] != "" {
		msg = slogMessages[e.Kind]
	}
	attrs := [7]slog.Attr{slog.String("strategy", string(e.Strategy)), slog.String("key", e.Key)}
	n := 2
	add := func(a slog.Attr) {
		attrs[n] = a
		n++
	}
	if e.Wait != 0 {
		add(slog.Duration("wait", e.Wait))
	}
	if e.Hold != 0 {
		add(slog.Duration("hold", e.Hold))
	}
	if e.Attempts != 0 {
		add(slog.Int("attempts", e.Attempts))
	}
	if e.Fence != 0 {
		add(slog.Int64("fence", e.Fence))
	}
	if e.Err != nil {
		add(slog.Any("err", e.Err))
	}
	o.logger.LogAttrs(ctx, level, msg, attrs[:n]...)
}
