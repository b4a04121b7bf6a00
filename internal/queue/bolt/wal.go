package bolt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	bbolt "go.etcd.io/bbolt"
)

// The write-ahead log. A bbolt commit costs two fdatasyncs and a dozen page
// writes whatever it carries, and one file has one writer: that bounded
// admissions to the commits the disk can do one after the other. So a group
// of admissions is made durable by appending it to this log (one write, one
// fdatasync) and answered; the committer writes the log's records into the
// bbolt file later, many groups in one transaction (updateTx), before
// any other write, so the file's order is the order of the writes. Open
// writes what the file lacks before anything reads it.
//
// The log is a preallocated file (walSize, zeros at first) that is written
// from its start again once every record in it is in the bbolt file:
// overwriting blocks that exist changes no metadata, so an fdatasync flushes
// the data alone. A record is
//
//	length (4, of the body) | CRC-32C (4, of seq and body) | seq (8) | body
//
// and the bbolt file keeps the seq of the last record it holds (keyWALApplied).
// Replay reads records while each is whole and follows the one before it
// (seq+1): the rest is an older pass of the log (its seqs are lower) or a
// write that was torn by the crash (never acknowledged: a group is answered
// only after its fdatasync).

// walSize is the log's file size. Records are written into the bbolt file
// long before it fills (walApplyBytes); a group too large for it is written
// to the bbolt file directly.
const walSize = 8 << 20

const walHeader = 16

var (
	keyWALApplied = []byte("wal-applied")
	walCRC        = crc32.MakeTable(crc32.Castagnoli)
	errWALFull    = errors.New("write-ahead log full")
)

// Operations of a record's body: the writes an admission makes, as data.
const (
	opPut       = 1 // bucket code, key, value
	opTenantLog = 2 // a tenant log entry (logTenant's value)
)

// walBuckets are the buckets an opPut may name, by code.
var walBuckets = [][]byte{1: bucketJobs, 2: bucketPayloads, 3: bucketWaiting, 4: bucketIdem}

const (
	walJobs byte = iota + 1
	walPayloads
	walWaiting
	walIdem
)

type wal struct {
	f    *os.File
	path string
	off  int64  // where the next record goes
	seq  uint64 // of the last record written (or applied)
	buf  []byte
}

// openWAL opens the log at path, creating it (and growing it to walSize
// with zeros) if needed.
func openWAL(path string) (*wal, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("write-ahead log: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("write-ahead log %s: %w", path, err)
	}
	if fi.Size() < walSize {
		if _, err := f.WriteAt(make([]byte, walSize-fi.Size()), fi.Size()); err != nil {
			f.Close()
			return nil, fmt.Errorf("write-ahead log %s: preallocate: %w", path, err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, fmt.Errorf("write-ahead log %s: %w", path, err)
		}
		if err := syncDir(path); err != nil {
			f.Close()
			return nil, err
		}
	}
	return &wal{f: f, path: path}, nil
}

// walRecord is one record read back: its seq and its operations.
type walRecord struct {
	seq  uint64
	body []byte
}

// readAfter reads the records that follow applied (see the log's rules
// above) and leaves the log positioned to write from its start.
func (w *wal) readAfter(applied uint64) ([]walRecord, error) {
	data := make([]byte, walSize)
	if _, err := w.f.ReadAt(data, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("write-ahead log %s: %w", w.path, err)
	}
	recs := parseWAL(data, applied)
	// What was read is written into the bbolt file before anything else
	// (Open): the log starts again after it.
	w.off, w.seq = 0, applied+uint64(len(recs))
	return recs, nil
}

// parseWAL reads the records of a log's data that follow applied: whole
// ones, each the one after the one before.
func parseWAL(data []byte, applied uint64) []walRecord {
	var recs []walRecord
	next := applied + 1
	for off := 0; off+walHeader <= len(data); {
		n := int(binary.LittleEndian.Uint32(data[off:]))
		sum := binary.LittleEndian.Uint32(data[off+4:])
		if n == 0 || n > len(data)-off-walHeader {
			break
		}
		framed := data[off+8 : off+walHeader+n] // seq and body
		if crc32.Checksum(framed, walCRC) != sum {
			break
		}
		seq := binary.LittleEndian.Uint64(framed)
		switch {
		case seq == next:
			recs = append(recs, walRecord{seq: seq, body: framed[8:]})
			next++
		case seq < next && len(recs) == 0:
			// Already in the bbolt file: an earlier pass of the log.
		default:
			return recs // a record of a later pass than the first: stop
		}
		off += walHeader + n
	}
	return recs
}

// append writes one record of body and makes it durable. errWALFull if it
// does not fit after what the log holds.
func (w *wal) append(body []byte) error {
	if w.off+walHeader+int64(len(body)) > walSize {
		return errWALFull
	}
	seq := w.seq + 1
	rec := frame(w.buf[:0], seq, body)
	w.buf = rec
	if _, err := w.f.WriteAt(rec, w.off); err != nil {
		return fmt.Errorf("write-ahead log: %w", err)
	}
	if err := syncData(w.f); err != nil {
		return fmt.Errorf("write-ahead log: %w", err)
	}
	w.off += int64(len(rec))
	w.seq = seq
	return nil
}

// frame appends to b the record of seq and body.
func frame(b []byte, seq uint64, body []byte) []byte {
	start := len(b)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(body)))
	b = binary.LittleEndian.AppendUint32(b, 0) // the CRC, below
	b = binary.LittleEndian.AppendUint64(b, seq)
	b = append(b, body...)
	binary.LittleEndian.PutUint32(b[start+4:], crc32.Checksum(b[start+8:], walCRC))
	return b
}

// rewind starts the log from its start again: every record in it is in the
// bbolt file.
func (w *wal) rewind() { w.off = 0 }

func (w *wal) close() error { return w.f.Close() }

// appendPut adds an opPut to a record's body.
func appendPut(b []byte, bucket byte, key, value []byte) []byte {
	b = append(b, opPut, bucket)
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	b = binary.AppendUvarint(b, uint64(len(value)))
	return append(b, value...)
}

// appendTenantLog adds an opTenantLog to a record's body.
func appendTenantLog(b []byte, entry []byte) []byte {
	b = append(b, opTenantLog)
	b = binary.AppendUvarint(b, uint64(len(entry)))
	return append(b, entry...)
}

// applyOps writes a record's operations in tx.
func applyOps(tx *bbolt.Tx, body []byte) error {
	d := decoder{b: body}
	for len(d.b) > 0 && !d.bad {
		switch op := d.byte(); op {
		case opPut:
			code := int(d.byte())
			key, value := d.bytes(), d.bytes()
			if d.bad || code <= 0 || code >= len(walBuckets) {
				return fmt.Errorf("write-ahead log: bad put (bucket %d): %w", code, errBadRecord)
			}
			b := tx.Bucket(walBuckets[code])
			if code == int(walPayloads) {
				b.FillPercent = 1 // appended (ids sort by time), never changed
			}
			if err := b.Put(key, value); err != nil {
				return err
			}
		case opTenantLog:
			entry := d.bytes()
			if d.bad {
				break
			}
			if err := putTenantLogEntry(tx, entry); err != nil {
				return err
			}
		default:
			return fmt.Errorf("write-ahead log: operation %d: %w", op, errBadRecord)
		}
	}
	if d.bad {
		return fmt.Errorf("write-ahead log: truncated operation: %w", errBadRecord)
	}
	return nil
}

// walApplied is the seq of the last log record the bbolt file holds.
func walApplied(tx *bbolt.Tx) uint64 {
	if b := tx.Bucket(bucketMeta); b != nil {
		if v := b.Get(keyWALApplied); len(v) == 8 {
			return binary.BigEndian.Uint64(v)
		}
	}
	return 0
}

func putWALApplied(tx *bbolt.Tx, seq uint64) error {
	return tx.Bucket(bucketMeta).Put(keyWALApplied, binary.BigEndian.AppendUint64(nil, seq))
}

func syncDir(path string) error {
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("write-ahead log: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("write-ahead log: sync directory: %w", err)
	}
	return nil
}
