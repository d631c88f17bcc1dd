// Package cache is tether-edge's on-disk state for the kube-apiserver
// proxy: the API objects node components read, kept per component and
// per resource, and the queue of status writes made while the cloud was
// unreachable. It is one bbolt file (apiserver-cache.db in the data dir).
//
// # Schema (version 1)
//
// The bucket tree is an API: change it only with a new schema version.
//
//	meta/
//	    "schema-version"  -> "1"
//	resources/
//	    <component>/                      kubelet, kube-proxy, coredns, ...
//	        <group>/<version>/<resource>  -> JSON ResourceInfo {kind, apiVersion, maxRV}
//	                                         ("core" is the legacy group: core/v1/pods)
//	objects/
//	    <component>/
//	        <group>/<version>/<resource>/
//	            <namespace>/<name>        -> record (cluster-scoped objects: "/<name>")
//	queue/                                   status writes made offline, in order
//	    <seq, 8 bytes big-endian>         -> JSON QueuedWrite (seq from the bucket's sequence)
//	evicted/                                 resources evicted for the size bound (may be absent)
//	    <component>/
//	        <group>/<version>/<resource>  -> time of the eviction (Unix seconds, 8 bytes big-endian)
//	ledger/                                  the queue's ledger (ledger.go)
//	    "enqueued", "coalesced", "applied",
//	    "obsolete", "rejected", "resent"  -> counter (8 bytes big-endian)
//	    sending/
//	        <seq, 8 bytes big-endian>     -> time of the mark (Unix seconds, 8 bytes big-endian)
//
// ResourceInfo's "updated" (Unix seconds), evicted/ and ledger/ were
// added within version 1: older builds ignore them (a file an older
// build wrote to since has a ledger that no longer balances, which the
// open logs). A build that ignores evicted/
// serves an evicted resource as soon as a watch event refills part of
// it; the versions that know it wait for a complete list.
//
// Every schema version keeps queue/ as it is here (the top-level bucket,
// its keys, its sequence and the JSON of QueuedWrite), and ledger/: they
// are what a version change carries over. A version that changes them
// must read the old form too.
//
// A record is: a flag byte (1 object from the cloud, 2 tombstone, 3
// object answered locally offline), the resourceVersion (8 bytes
// big-endian), the length of the meta section (4 bytes big-endian), the
// meta section, and the object's JSON with kind and apiVersion set (list
// items get them from the list's kind). The meta section is a sequence of
// strings, each a uvarint length and its bytes: kind, apiVersion,
// namespace, name, uid, the number of labels (decimal) and each key and
// value, the number of indexed fields and each path and value: the fields
// kube-apiserver supports in field selectors for the kind (spec.nodeName,
// status.phase, ... of a Pod), so that lists with selectors never decode
// objects. A tombstone has no JSON; its meta section is the time of the
// deletion (Unix seconds, 8 bytes big-endian), or empty in tombstones of
// older builds.
//
// # Invariants
//
//   - Per object the stored resourceVersion never goes backwards: a put
//     with an older resourceVersion than the record's is ignored, and a
//     tombstone (left by a DELETED watch event) blocks every put that is
//     not newer than the deletion. resourceVersions are compared as
//     numbers (kube-apiserver's are etcd revisions); one that is not a
//     number counts as 0 and is always written.
//   - ResourceInfo.MaxRV is the largest resourceVersion seen for the
//     resource (objects, lists, bookmarks, deletions): the list
//     resourceVersion served offline.
//   - A complete list (no continue token, not a page) replaces what it
//     covers: stored objects in its namespace that match its selectors and
//     are not newer than the list, but are absent from it, are removed.
//   - All writes go through one goroutine, in the order they were
//     submitted, in batched read-write transactions: a crash (kill -9)
//     loses at most the batch being committed, never the file. Queue
//     writes return only once committed (fsync).
//   - Read transactions are short: values are copied out and decoded after
//     the transaction ends. No slice returned by this package points into
//     the memory map.
//   - The file is bounded (Options.MaxSize, tether-edge's
//     --cache-max-size): when the bytes of its pages that hold data pass
//     the bound, whole resources (a component's objects of one resource)
//     are evicted, least recently updated first, until the data is under
//     90 % of it. Queued writes are never evicted. An evicted resource is
//     not served (Info, List, Scan: not found) until a complete list
//     (ApplyList, Prune) fills it again, so that the cache never serves
//     part of a list as the whole.
//   - Tombstones expire after Options.TombstoneTTL (an hour): a version
//     older than a deletion can only come from an answer that started
//     before it, at a revision kube-apiserver still serves (etcd compacts
//     older ones every 5 minutes by default). MaxRV is never lowered.
//   - bbolt never shrinks its file: the file is compacted (copied into
//     <file>.compact, fsynced, renamed over it) at open and after a batch
//     when at least 4 MiB and half of it are free pages, or it is over the
//     bound, at most every 10 minutes. The file at the path is whole at
//     every instant; a copy left by a crash is removed at open.
//   - Open walks the whole file; a file that does not open or does not
//     pass the walk is renamed to <file>.corrupt-<time> (only the newest
//     such file is kept), logged at error with both names, and a fresh
//     file is created: a broken cache never stops tether-edge
//     (internal/boltfile, which the pool replica uses too).
//   - A file of another schema version (or of none) is moved aside in the
//     same way, but its queued writes are carried into the fresh file,
//     with their seqs; the cached objects are not (the cloud has them).
//     If a queued write does not read as this build's QueuedWrite (not
//     JSON, a field it does not know, no method, path or object), the
//     file is put back and Open fails with ErrQueueNotCarried, saying what
//     to do: queued writes are never dropped in silence.
//   - The queue's ledger counts, in the transaction of each event, the
//     writes enqueued (Enqueue, ReplaceQueued), coalesced (the write
//     ReplaceQueued removes), applied, obsolete and rejected (Dequeue's
//     outcome), so that at every commit enqueued = coalesced + applied +
//     obsolete + rejected + queued. MarkSending marks a write before the
//     replay sends it; Dequeue and ReplaceQueued (which hands the mark to
//     the write in its place) remove it in their transaction. A mark found
//     at the next MarkSending (left by a process killed between send and
//     dequeue, or a send that got no answer that settles it) counts the
//     send as resent. The ledger survives compaction and is carried over
//     a schema change with the queue.
package cache
