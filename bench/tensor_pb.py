"""ONNX TensorProto files (test_data_set_0/*.pb) read and written with NumPy alone (the onnx package is not
needed): the protobuf wire format of the fields a test tensor uses: dims (1), data_type (2), the typed
repeated fields (4 float, 5 int32, 7 int64, 10 double), name (8), raw_data (9)."""
import numpy as np

# ONNX TensorProto.DataType -> NumPy
TYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
         10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}
CODES = {np.dtype(v): k for k, v in TYPES.items()}


def _varint(buf, i):
    r, s = 0, 0
    while True:
        b = buf[i]
        i += 1
        r |= (b & 0x7F) << s
        s += 7
        if b < 0x80:
            return r, i


def _put_varint(v):
    out = bytearray()
    v &= (1 << 64) - 1
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read(path):
    """The tensor of one .pb file as a NumPy array."""
    with open(path, "rb") as f:
        buf = f.read()
    dims, dtype, raw, typed = [], 1, None, {4: [], 5: [], 7: [], 10: []}
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
            if field == 1:
                dims.append(v if v < 1 << 63 else v - (1 << 64))
            elif field == 2:
                dtype = v
            elif field in (5, 7):
                typed[field].append(v if v < 1 << 63 else v - (1 << 64))
        elif wire == 2:
            n, i = _varint(buf, i)
            chunk = buf[i:i + n]
            i += n
            if field == 9:
                raw = chunk
            elif field == 1:  # packed dims
                j = 0
                while j < len(chunk):
                    v, j = _varint(chunk, j)
                    dims.append(v)
            elif field == 4:
                typed[4] += list(np.frombuffer(chunk, "<f4"))
            elif field == 10:
                typed[10] += list(np.frombuffer(chunk, "<f8"))
            elif field in (5, 7):
                j = 0
                while j < len(chunk):
                    v, j = _varint(chunk, j)
                    typed[field].append(v if v < 1 << 63 else v - (1 << 64))
        elif wire == 5:
            if field == 4:
                typed[4].append(np.frombuffer(buf[i:i + 4], "<f4")[0])
            i += 4
        elif wire == 1:
            if field == 10:
                typed[10].append(np.frombuffer(buf[i:i + 8], "<f8")[0])
            i += 8
        else:
            raise ValueError(f"{path}: wire type {wire} not understood")
    t = np.dtype(TYPES[dtype])
    if raw is not None:
        a = np.frombuffer(raw, t.newbyteorder("<")).astype(t)
    else:
        src = typed[4] or typed[10] or typed[7] or typed[5]
        a = np.array(src).astype(t)
    return a.reshape(dims)


def write(path, array, name):
    a = np.ascontiguousarray(array)
    out = bytearray()
    for d in a.shape:
        out += _put_varint(1 << 3 | 0) + _put_varint(d)
    out += _put_varint(2 << 3 | 0) + _put_varint(CODES[a.dtype])
    nb = name.encode()
    out += _put_varint(8 << 3 | 2) + _put_varint(len(nb)) + nb
    raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
    out += _put_varint(9 << 3 | 2) + _put_varint(len(raw)) + raw
    with open(path, "wb") as f:
        f.write(bytes(out))
