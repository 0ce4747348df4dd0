package consumer

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/utils/clock"

	"github.com/seqinbox/seqinbox/internal/consumerstate"
)

// State is what this consumer tells the operator (consumerstate.State): its readiness and build,
// and from the same collectors that /metrics serves, so that the two never disagree, its
// partitions and their lag, its dead letters of the last hour and, on the housekeeping leader,
// the database-wide counts. The blocked record comes with its error, which no metric carries.
func (c *Consumer) State(context.Context) consumerstate.State {
	ready, reason := c.Ready()
	s := consumerstate.State{
		Instance: c.cfg.InstanceID, Ready: ready, EngineVersion: c.build.engineVersion, ClaimProtocol: c.build.claimProtocol,
		Partitions: []consumerstate.Partition{},
	}
	if !ready {
		s.Reason = reason
	}
	if b := c.blocked.longest(); b != nil {
		s.Blocked = &consumerstate.Blocked{Topic: b.Topic, Partition: b.Partition, Offset: b.Offset, Since: b.Since, Error: b.Error}
	}
	families, err := c.registry.Gather()
	if err != nil {
		// A collector that failed (the database-wide counts) leaves the rest of the state standing.
		c.log.V(1).Info("some metrics of the consumer state could not be read", "error", err.Error())
	}
	var (
		deadLetters float64
		byReason    = map[string]float64{}
		db          consumerstate.Database
		leader      bool
	)
	for _, f := range families {
		switch f.GetName() {
		case "seqinbox_consumer_lag":
			for _, m := range f.GetMetric() {
				partition, _ := strconv.ParseInt(label(m, "partition"), 10, 32)
				s.Partitions = append(s.Partitions, consumerstate.Partition{
					Topic: label(m, "topic"), Partition: int32(partition), Lag: int64(m.GetGauge().GetValue())})
			}
		case "seqinbox_dead_letters_total":
			for _, m := range f.GetMetric() {
				deadLetters += m.GetCounter().GetValue()
				byReason[label(m, "reason")] = m.GetCounter().GetValue()
			}
		case "seqinbox_messages_waiting":
			for _, m := range f.GetMetric() {
				if db.WaitingByType == nil {
					db.WaitingByType = map[string]int64{}
				}
				db.WaitingByType[label(m, "type")] = int64(m.GetGauge().GetValue())
			}
		case "seqinbox_oldest_waiting_message_age_seconds":
			for _, m := range f.GetMetric() {
				age := m.GetGauge().GetValue()
				db.OldestWaitingSeconds = max(db.OldestWaitingSeconds, age)
				if db.OldestWaitingSecondsByType == nil {
					db.OldestWaitingSecondsByType = map[string]float64{}
				}
				typ := label(m, "type")
				db.OldestWaitingSecondsByType[typ] = max(db.OldestWaitingSecondsByType[typ], age)
			}
		case "seqinbox_instances_expiring_soon":
			// The leader always serves this gauge, zero or not; every other consumer never does.
			leader = true
			db.InstancesExpiringSoon = int64(f.GetMetric()[0].GetGauge().GetValue())
		case "seqinbox_instances_expired":
			db.InstancesExpired = int64(f.GetMetric()[0].GetGauge().GetValue())
		}
	}
	slices.SortFunc(s.Partitions, func(a, b consumerstate.Partition) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Partition - b.Partition)
	})
	s.DeadLettersLastHour = c.deadLetters.lastHour(deadLetters)
	for reason, total := range byReason {
		if n := c.deadLettersOf(reason).lastHour(total); n > 0 {
			if s.DeadLettersLastHourByReason == nil {
				s.DeadLettersLastHourByReason = map[string]int64{}
			}
			s.DeadLettersLastHourByReason[reason] = n
		}
	}
	if leader {
		if db.WaitingByType == nil {
			db.WaitingByType = map[string]int64{}
		}
		s.Database = &db
	}
	return s
}

// deadLettersOf is the hourly count of the dead letters of one reason, begun when the reason's
// counter first showed (it was zero before).
func (c *Consumer) deadLettersOf(reason string) *hourlyCount {
	c.deadLettersMu.Lock()
	defer c.deadLettersMu.Unlock()
	h, ok := c.deadLettersByReason[reason]
	if !ok {
		h = newHourlyCount(c.cfg.Clock)
		c.deadLettersByReason[reason] = h
	}
	return h
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// hourlyCount turns a counter into its increase over the last hour, to about sampleEvery: it
// keeps one sample of the counter per sampleEvery, taken when asked, and subtracts the newest
// sample at least an hour old (or the counter's zero at the start).
type hourlyCount struct {
	clock clock.PassiveClock

	mu      sync.Mutex
	samples []countSample
}

type countSample struct {
	at    time.Time
	total float64
}

const sampleEvery = time.Minute

func newHourlyCount(clk clock.PassiveClock) *hourlyCount {
	return &hourlyCount{clock: clk, samples: []countSample{{at: clk.Now()}}}
}

// lastHour records total, the counter's value now, and returns its increase over the last hour.
func (h *hourlyCount) lastHour(total float64) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.clock.Now()
	if now.Sub(h.samples[len(h.samples)-1].at) >= sampleEvery {
		h.samples = append(h.samples, countSample{at: now, total: total})
	}
	// The base is the newest sample at least an hour old; older ones are no longer needed.
	base := 0
	for i, s := range h.samples {
		if now.Sub(s.at) >= time.Hour {
			base = i
		}
	}
	h.samples = h.samples[base:]
	return int64(total - h.samples[0].total)
}
