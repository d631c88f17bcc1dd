// Package cache is tether-edge's on-disk state for the kube-apiserver
// proxy: the API objects node components read, kept per component and
// per resource, and the queue of status writes made while the cloud was
// unreachable. It is one bbolt file (apiserver-cache.db in the data dir).
//
// # Schema (version 2)
//
// The bucket tree and the record format are an API: change them only with
// a new schema version. They are written down, with the pool replica's,
// in internal/localapi/README.md ("The two stores' files"): meta/
// (schema-version), resources/ and objects/ per component and resource
// (objects as records: a flag byte, the resourceVersion, a meta section
// with the key, labels and indexed fields, and the JSON), queue/,
// evicted/, ledger/ and tokens/ (the service-account tokens the cloud
// issued to node components, apart from the objects: tokens.go).
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
