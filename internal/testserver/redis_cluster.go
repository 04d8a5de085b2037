package testserver

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster starts a Redis Cluster of masters nodes (no replicas) for t
// alone, from the locally installed redis-server and redis-cli, and returns
// a client of it, closed when t ends; the nodes are stopped and their
// directories removed then too. It fails t when the cluster does not come
// up. Three masters is the least redis-cli creates.
func RedisCluster(t testing.TB, masters int) *redis.ClusterClient {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("testserver: redis-cli not found (Debian: apt-get install redis-tools): %v", err)
	}
	var addrs []string
	for range masters {
		// The cluster bus listens on a port of its own; the default, the
		// node's port + 10000, may be past 65535 for a free port.
		bus, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		node := ownRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(bus), "--cluster-node-timeout", "5000")
		addrs = append(addrs, node.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("testserver: redis-cli --cluster create: %v\n%s", err, out)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { c.Close() })
	// Every node must agree that all slots are served before a client can
	// rely on its view of the cluster.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, addr := range addrs {
		if err := clusterOK(ctx, addr); err != nil {
			t.Fatalf("testserver: redis cluster node %s: %v", addr, err)
		}
	}
	c.ReloadState(ctx)
	if err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
		t.Fatalf("testserver: redis cluster: %v", err)
	}
	return c
}

// clusterOK waits until the node at addr reports cluster_state:ok, or ctx
// ends.
func clusterOK(ctx context.Context, addr string) error {
	node := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer node.Close()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := node.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster_state not ok (last: %v): %w", err, ctx.Err())
		case <-tick.C:
		}
	}
}
