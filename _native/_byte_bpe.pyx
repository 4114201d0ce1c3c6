# cython: boundscheck=False, wraparound=False
"""Byte-level BPE encoding of Python strings in native code (`byte_bpe.h`); no pure-Python twin:
without it the engine encodes with `tokenizers` itself, which this equals."""

from libc.stdint cimport int32_t, uint8_t, uint32_t
from libc.string cimport memcpy
from libcpp cimport bool as cbool
from libcpp.string cimport string
from libcpp.vector cimport vector

import numpy as np

__all__ = ["PATTERNS", "ByteLevelBPE"]

PATTERNS = {"gpt2": 0, "qwen2": 1, "llama3": 2}  # byte_bpe::Pattern


cdef extern from "Python.h":
    int PyUnicode_KIND(object text)
    void* PyUnicode_DATA(object text)
    Py_ssize_t PyUnicode_GET_LENGTH(object text)


cdef extern from "byte_bpe.h" namespace "byte_bpe":
    cdef cppclass Encoder:
        Encoder(int pattern, const int32_t* byte_ids, size_t n_merges, const int32_t* left,
                const int32_t* right, const int32_t* merged, size_t cache_limit) except +
        void SetClass(uint32_t code_point, uint8_t cls)
        void AddWholeToken(const string& token, int32_t id)
        void EncodeMany(size_t n, const void* const* data, const int* kinds,
                        const size_t* lengths, vector[int32_t]* out, char* done,
                        int max_threads) nogil
        cbool Split(const void* data, int kind, size_t length, vector[size_t]* ends)


cdef class ByteLevelBPE:
    """Ids of texts under one byte-level BPE model and pre-tokenizer pattern.

    `byte_ids`: i32[256], each byte's token; `merges`: i32[n, 3] rows (left, right, merged) in
    rank order. Code point classes start unknown: `set_classes` gives them (1 letter, 2 number,
    3 whitespace, 4 other)."""

    cdef Encoder* encoder

    def __cinit__(self, str pattern, byte_ids, merges, size_t cache_limit=1 << 16):
        cdef const int32_t[::1] bytes_ = np.ascontiguousarray(byte_ids, np.int32)
        table = np.asarray(merges, np.int32).reshape(-1, 3)
        cdef Py_ssize_t n_merges = len(table)
        if bytes_.shape[0] != 256:
            raise ValueError(f"byte_ids: 256 ids, not {bytes_.shape[0]}")
        if n_merges == 0:
            table = np.zeros((1, 3), np.int32)  # a row to point at; none is read
        cdef const int32_t[::1] left = np.ascontiguousarray(table[:, 0])
        cdef const int32_t[::1] right = np.ascontiguousarray(table[:, 1])
        cdef const int32_t[::1] merged = np.ascontiguousarray(table[:, 2])
        self.encoder = new Encoder(
            PATTERNS[pattern], &bytes_[0], n_merges, &left[0], &right[0], &merged[0],
            cache_limit,
        )

    def __dealloc__(self):
        del self.encoder

    def set_classes(self, code_points, classes) -> None:
        """Each code point's class (1-4, or 0: unknown again)."""
        for c, k in zip(code_points, classes, strict=True):
            self.encoder.SetClass(c, k)

    def split(self, str text):
        """The pre-tokenizer's pieces of `text` as each piece's end (code points), or None
        where it holds a code point of unknown class."""
        cdef vector[size_t] ends
        if not self.encoder.Split(
            PyUnicode_DATA(text), PyUnicode_KIND(text), PyUnicode_GET_LENGTH(text), &ends
        ):
            return None
        return ends

    def ignore_merges(self, tokens) -> None:
        """`tokenizers`' `ignore_merges`: each (bytes, id) of `tokens` is what a piece of
        exactly those bytes encodes to, before any merge."""
        for token, id_ in tokens:
            self.encoder.AddWholeToken(token, id_)

    def encode_batch(self, list texts, prefix=(), suffix=(), int threads=1) -> list:
        """Each text's ids, `prefix` before and `suffix` after, as int32 views into one buffer
        (not lists: a batch's ids are no Python ints for the collector to walk), or None where
        the text holds a code point of unknown class. The encoding runs without the GIL, on up
        to `threads` threads, 16,384 code points a thread at least, each taking the next text
        as it comes free."""
        cdef Py_ssize_t n = len(texts), i, at = 0, size
        cdef vector[void*] data
        cdef vector[int] kinds
        cdef vector[size_t] lengths
        cdef vector[vector[int32_t]] out
        cdef vector[char] done
        data.resize(n)
        kinds.resize(n)
        lengths.resize(n)
        out.resize(n)
        done.resize(n)
        for i in range(n):
            text = texts[i]
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}]: a str, not {type(text).__name__}")
            data[i] = PyUnicode_DATA(text)
            kinds[i] = PyUnicode_KIND(text)
            lengths[i] = PyUnicode_GET_LENGTH(text)
        with nogil:
            self.encoder.EncodeMany(
                n, data.data(), kinds.data(), lengths.data(), out.data(), done.data(), threads
            )
        head = np.asarray(prefix, np.int32).reshape(-1)
        tail = np.asarray(suffix, np.int32).reshape(-1)
        cdef Py_ssize_t wrap = len(head) + len(tail), total = 0
        for i in range(n):
            if done[i]:
                total += wrap + <Py_ssize_t>out[i].size()
        buffer = np.empty(max(total, 1), np.int32)
        cdef int32_t[::1] b = buffer
        seqs = []
        for i in range(n):
            if not done[i]:
                seqs.append(None)
                continue
            size = wrap + <Py_ssize_t>out[i].size()
            if len(head):
                buffer[at : at + len(head)] = head
            if out[i].size():
                memcpy(&b[at + len(head)], out[i].data(), out[i].size() * sizeof(int32_t))
            if len(tail):
                buffer[at + size - len(tail) : at + size] = tail
            seqs.append(buffer[at : at + size])
            at += size
        return seqs
