// etcd for gpushare's real-node tests: the upstream server's entry point, built from its
// module (its own go.mod replaces its sibling modules, so `go install` of it is refused).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
