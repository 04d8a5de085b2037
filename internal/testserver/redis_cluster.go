package testserver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisClusterEnv names an existing Redis Cluster for [RedisCluster] to use
// instead of starting one: the host:port of some of its nodes, separated by
// commas.
const RedisClusterEnv = "CONTEND_REDIS_CLUSTER_ADDRS"

// RedisCluster returns a client of a Redis Cluster, closed when t ends: the
// one [RedisClusterEnv] names, shared with whatever else uses it (tests keep
// their keys under a prefix of their own), or else one of masters nodes (no
// replicas) that it starts for t alone, [StartCluster] with no replicas.
func RedisCluster(t testing.TB, masters int) *redis.ClusterClient {
	t.Helper()
	addrs := os.Getenv(RedisClusterEnv)
	if addrs == "" {
		return StartCluster(t, ClusterOptions{Masters: masters}).Client
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ",")})
	t.Cleanup(func() { c.Close() })
	if err := c.ForEachMaster(context.Background(), func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
		t.Fatalf("testserver: redis cluster at %s=%s: %v", RedisClusterEnv, addrs, err)
	}
	return c
}

// ClusterOptions says what Redis Cluster [StartCluster] makes.
type ClusterOptions struct {
	// Masters is how many masters share the slots; three is the least
	// redis-cli creates.
	Masters int
	// Replicas is how many replicas each master has. Default: none.
	Replicas int
	// NodeTimeout is the cluster-node-timeout: how long a node may be
	// unreachable before it counts as failed and a replica takes its
	// place. Default: 5s. A failover test wants it short; on a loaded
	// machine a short one may fail a node over that was only slow.
	NodeTimeout time.Duration
}

// A Cluster is a Redis Cluster that belongs to one test: its nodes may be
// stopped, to fail a master over to its replica.
type Cluster struct {
	// Client is a client of the whole cluster, closed when the test ends.
	Client *redis.ClusterClient
	// Nodes are the cluster's servers, masters and replicas alike.
	Nodes []*OwnedRedis
}

// Node returns the node listening at addr (host:port), or nil.
func (c *Cluster) Node(addr string) *OwnedRedis {
	for _, n := range c.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// StartCluster starts a Redis Cluster for t alone, from the locally
// installed redis-server and redis-cli, and waits until every node says
// the cluster is ok and every replica has synchronised with its master.
// The nodes are stopped and their directories removed when t ends. It
// fails t when the cluster does not come up.
func StartCluster(t testing.TB, o ClusterOptions) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("testserver: redis-cli not found (Debian: apt-get install redis-tools): %v", err)
	}
	if o.NodeTimeout <= 0 {
		o.NodeTimeout = 5 * time.Second
	}
	cl := &Cluster{}
	var addrs []string
	for range o.Masters * (1 + o.Replicas) {
		// The cluster bus listens on a port of its own; the default, the
		// node's port + 10000, may be past 65535 for a free port.
		bus, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		node := ownRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(bus),
			"--cluster-node-timeout", strconv.FormatInt(o.NodeTimeout.Milliseconds(), 10))
		cl.Nodes = append(cl.Nodes, node)
		addrs = append(addrs, node.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(o.Replicas), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("testserver: redis-cli --cluster create: %v\n%s", err, out)
	}
	cl.Client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { cl.Client.Close() })
	// Every node must agree that all slots are served before a client can
	// rely on its view of the cluster.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, addr := range addrs {
		if err := clusterOK(ctx, addr); err != nil {
			t.Fatalf("testserver: redis cluster node %s: %v", addr, err)
		}
	}
	for _, addr := range addrs {
		if err := synced(ctx, addr); err != nil {
			t.Fatalf("testserver: redis cluster: %v", err)
		}
	}
	cl.Client.ReloadState(ctx)
	return cl
}

// synced waits until node answers and, if it is a replica, its link to its
// master is up: a replica still loading its first copy cannot take over.
func synced(ctx context.Context, addr string) error {
	node := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer node.Close()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := node.Info(ctx, "replication").Result()
		if err == nil && (strings.Contains(info, "role:master") || strings.Contains(info, "master_link_status:up")) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not in sync (last: %v): %w", addr, err, ctx.Err())
		case <-tick.C:
		}
	}
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
