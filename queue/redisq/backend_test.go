package redisq_test

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
)

// onBoth are the tests that run on one Redis node and on a Redis Cluster:
// what the queue promises must not depend on how Redis is deployed, and a
// Cluster refuses what one node lets pass (a transaction across slots).
var onBoth = []struct {
	name string
	run  func(t *testing.T, client redis.UniversalClient, prefix string)
}{
	{"submit", testSubmit},
	{"order_per_key", testOrderPerKey},
	{"redelivers_pending_in_order", testRedeliversPending},
	{"sell_hot_key", testSellHotKey},
	{"takeover_after_lease_expires", testTakeover},
	{"rebalance", testRebalance},
	{"batch_poison_dead_lettered", testBatchPoison},
	{"duplicate_answer", testDuplicateAnswer},
	{"keys_left", testKeysLeft},
	{"dead_letters", testDeadLetters},
}

func TestOneNode(t *testing.T) {
	t.Parallel()
	for _, tc := range onBoth {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			client, prefix := testserver.Redis(t)
			tc.run(t, client, prefix)
		})
	}
}

// acrossProcesses are the tests in several OS processes: each runs on one
// node as a test of its own, and on a Cluster in TestCluster.
var acrossProcesses = []struct {
	name string
	run  func(t *testing.T, setup deployment)
}{
	{"order_per_key_across_processes", orderAcrossProcesses},
	{"sell_across_processes", sellAcrossProcesses},
}

// TestCluster runs the tests of onBoth and acrossProcesses on the shared
// Redis Cluster of three masters (each test has a prefix of its own):
// starting a cluster costs more than most of the tests. Its worker
// processes find the cluster through the environment, where RedisCluster
// put it, or through their parameters.
func TestCluster(t *testing.T) {
	t.Parallel()
	cluster := testserver.RedisCluster(t, 3)
	addrs := strings.Join(cluster.Options().Addrs, ",")
	for _, tc := range onBoth {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, cluster, testserver.ClusterPrefix(t, cluster))
		})
	}
	onCluster := func(t *testing.T) (redis.UniversalClient, harness.Params) {
		return cluster, harness.Params{"prefix": testserver.ClusterPrefix(t, cluster), "cluster": addrs}
	}
	for _, tc := range acrossProcesses {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, onCluster)
		})
	}
}
