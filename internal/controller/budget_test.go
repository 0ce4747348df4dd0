package controller

import (
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

func budgetSpec(poolSize, replicas int32, budget *int32) *v1alpha1.SequentialInboxSpec {
	return &v1alpha1.SequentialInboxSpec{
		Replicas: ptr.To(replicas),
		Database: v1alpha1.DatabaseSpec{PoolSize: poolSize, ConnectionBudget: budget},
	}
}

func TestConnectionBudgetMustFitOneConsumerAndTheMigrationJob(t *testing.T) {
	cases := []struct {
		name                string
		pool, replicas      int32
		budget              *int32
		wantErr             bool
		wantMessageContains string
	}{
		{name: "no budget is never exceeded", pool: 100, replicas: 100, budget: nil},
		{name: "one pool, its maintenance pool and the job fit exactly", pool: 10, replicas: 1, budget: ptr.To(int32(15))},
		{name: "more replicas than fit are capped, not invalid", pool: 10, replicas: 3, budget: ptr.To(int32(30))},
		{name: "the job's connection does not fit next to one consumer", pool: 10, replicas: 1, budget: ptr.To(int32(14)),
			wantErr: true, wantMessageContains: "one consumer's 10 connections + 4 for its maintenance + 1 for the migration Job = 15 exceed spec.database.connectionBudget 14"},
		{name: "the maintenance pool does not fit", pool: 10, replicas: 1, budget: ptr.To(int32(11)), wantErr: true, wantMessageContains: "= 15 exceed"},
		{name: "zero replicas still need room for one", pool: 10, replicas: 0, budget: ptr.To(int32(2)), wantErr: true, wantMessageContains: "= 15 exceed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := checkConnectionBudget(budgetSpec(tc.pool, tc.replicas, tc.budget))
			if (err != nil) != tc.wantErr {
				t.Fatalf("checkConnectionBudget() = %v, want error %v", err, tc.wantErr)
			}
			if err == nil {
				return
			}
			if err.Field != "spec.database.poolSize" {
				t.Errorf("field = %q, want spec.database.poolSize", err.Field)
			}
			if !strings.Contains(err.Error(), tc.wantMessageContains) {
				t.Errorf("message %q does not contain %q", err.Error(), tc.wantMessageContains)
			}
		})
	}
}

func pollSpec(maxPollMs int32, timeout time.Duration, retries int32, backoff time.Duration) *v1alpha1.SequentialInboxSpec {
	return &v1alpha1.SequentialInboxSpec{
		Kafka: v1alpha1.KafkaSpec{MaxPollIntervalMs: maxPollMs},
		Sink: v1alpha1.SinkSpec{
			Timeout: v1alpha1.Duration{Duration: timeout}, Retries: ptr.To(retries),
			InitialBackoff: v1alpha1.Duration{Duration: backoff},
		},
	}
}

func TestWorstCaseRecordTimeIsChainTimesAttemptsPlusBackoff(t *testing.T) {
	cases := []struct {
		name  string
		spec  *v1alpha1.SequentialInboxSpec
		chain int
		want  time.Duration
	}{
		{name: "defaults, chain of one", spec: pollSpec(300000, 10*time.Second, 3, 200*time.Millisecond), chain: 1,
			want: 4*10*time.Second + (200+400+800)*time.Millisecond},
		{name: "no retries has no backoff", spec: pollSpec(300000, 5*time.Second, 0, time.Second), chain: 3, want: 15 * time.Second},
		{name: "an empty chain counts as one delivery", spec: pollSpec(300000, 5*time.Second, 0, time.Second), chain: 0, want: 5 * time.Second},
		{name: "chain of four with one retry", spec: pollSpec(300000, 2*time.Second, 1, time.Second), chain: 4, want: 4 * (4*time.Second + time.Second)},
		{name: "each backoff wait is capped at 30s, as the sink caps it", spec: pollSpec(300000, time.Second, 5, 20*time.Second), chain: 1,
			want: 6*time.Second + (20+30+30+30+30)*time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := worstCaseRecordTime(tc.spec, tc.chain); got != tc.want {
				t.Errorf("worstCaseRecordTime() = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestPollIntervalWarningWhenTheWorstCaseExceedsIt(t *testing.T) {
	cases := []struct {
		name     string
		spec     *v1alpha1.SequentialInboxSpec
		chain    int
		wantWarn bool
	}{
		{name: "defaults with a chain of five fit 300s", spec: pollSpec(300000, 10*time.Second, 3, 200*time.Millisecond), chain: 5},
		{name: "a chain of eight does not fit 300s", spec: pollSpec(300000, 10*time.Second, 3, 200*time.Millisecond), chain: 8, wantWarn: true},
		{name: "exactly at the limit is fine", spec: pollSpec(15000, 5*time.Second, 0, 0), chain: 3},
		{name: "one millisecond short warns", spec: pollSpec(14999, 5*time.Second, 0, 0), chain: 3, wantWarn: true},
		{name: "capped backoffs fit where doubling without a cap would not", spec: pollSpec(200000, time.Second, 5, 20*time.Second), chain: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			warning := checkPollInterval(tc.spec, tc.chain)
			if (warning != nil) != tc.wantWarn {
				t.Fatalf("checkPollInterval() = %v, want warning %v", warning, tc.wantWarn)
			}
			if warning != nil && warning.Field != "spec.kafka.maxPollIntervalMs" {
				t.Errorf("field = %q, want spec.kafka.maxPollIntervalMs", warning.Field)
			}
		})
	}
}
