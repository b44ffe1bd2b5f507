"""An XLA program read as a roofline: the bytes each of its kernels moves and the FLOPs of its matmuls.

`kernel_costs` walks the entry computation of an optimized, scheduled HLO
module (the text of ``jax.jit(f).lower(...).compile().as_text()``). Each of
its instructions that computes something is one kernel on a GPU (a fusion, a
library matmul, a copy); it reads its operands and writes its result, and
nothing it keeps on chip in between counts. An operand that the kernel only
slices or gathers counts with the part it reads, and so do the operands of a
fusion that slices what it computes (it computes only what it writes). A matmul's FLOPs are
``2 * output elements * contracted size``, inside a fusion or as a library
call (cuBLAS' custom call); a convolution's (cuDNN's calls, each pass)
those of its forward pass.

`roofline` bounds each kernel by the slower of its bytes at the device's
read bandwidth and its FLOPs at its matmul rate, and sums the bounds: the
step's time if its kernels ran one after another at those rates, a floor
that a profile's kernel time can be set beside. The rates are measured
ones (the GPU suite's references), not the data sheet's.

It reads the text alone, so it works on any XLA backend's module. The GPU
plan suite (`keras_attnconv.bench.plan_suite`) compiles a training step
for a GPU on a machine without one and reads it with this.
"""

import collections
import dataclasses
import math
import re

# Bytes per element of HLO's element types.
_ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4}
_ELEMENT_BYTES.update({"f64": 8, "s64": 8, "u64": 8})
_ARRAY = re.compile(r"\b(" + "|".join(_ELEMENT_BYTES) + r")\[([0-9,]*)\]")
# `%name = shape opcode(operands), attributes`, the shape a tuple or an array with its layout.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*?) ([\w-]+)\((.*)$")
# Instructions that are no kernel: they name or regroup buffers, or only start and end a transfer.
_NO_KERNEL = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "copy-start", "copy-done"}
_PARTIAL_READS = {"slice", "dynamic-slice", "gather"}


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    shape: str  # the result's shape text, e.g. "bf16[100,256]{1,0}" or a tuple of them
    opcode: str
    rest: str  # the operands and attributes, as written

    @property
    def operands(self):
        """The names of the operands, in order."""
        return re.findall(r"%([\w.\-]+)", self.rest.split("), ")[0])

    @property
    def callees(self):
        return re.findall(r"calls=%([\w.\-]+)", self.rest)


@dataclasses.dataclass(frozen=True)
class KernelCost:
    name: str
    kind: str  # "matmul" (a matmul or a convolution), or the fusion's kind ("kLoop", "kInput", ...) or opcode
    bytes: int  # read and written
    flops: int
    source: str  # the framework op it came from (XLA's op_name metadata), "" if none
    shape: str  # the result's (its first array, for a tuple)


def array_bytes(shape):
    """Bytes of every array in an HLO shape text (a tuple counts all its arrays)."""
    return sum(
        math.prod(int(size) for size in filter(None, dimensions.split(","))) * _ELEMENT_BYTES[element]
        for element, dimensions in _ARRAY.findall(shape)
    )


def _dimensions(shape):
    match = _ARRAY.search(shape)
    return [int(size) for size in filter(None, match.group(2).split(","))] if match else []


def parse_module(text):
    """{computation name: [Instruction]} of an HLO module's text; the entry computation is named "ENTRY"."""
    computations, body = {}, None
    for line in text.splitlines():
        if line.startswith("ENTRY"):
            body = computations.setdefault("ENTRY", [])
        elif line.startswith("%") and line.rstrip().endswith("{"):
            body = computations.setdefault(line.split()[0][1:], [])
        elif line.startswith("}"):
            body = None
        elif body is not None and (match := _INSTRUCTION.match(line)):
            body.append(Instruction(*match.groups()))
    if "ENTRY" not in computations:
        raise ValueError("The text has no ENTRY computation: it is not an HLO module's text.")
    return computations


def _contracted_size(rest, lhs_shape):
    """The product of the lhs' contracting dimensions, as a dot or a library matmul's attributes give them."""
    match = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", rest) or re.search(
        r'"lhs_contracting_dimensions":\[([^\]]*)\]', rest
    )
    dimensions = _dimensions(lhs_shape)
    return math.prod(dimensions[int(index)] for index in (re.findall(r"\d+", match.group(1)) if match else []))


def _matmul_flops(instruction, shapes):
    elements = math.prod(_dimensions(instruction.shape))  # a library call's tuple: its first array is the product
    return 2 * elements * _contracted_size(instruction.rest, shapes.get(instruction.operands[0], ""))


def _library_call(instruction):
    """The target of a library call (cuBLAS' "__cublas$...", cuDNN's "__cudnn$conv..."), or None."""
    target = re.search(r'custom_call_target="([^"]*)"', instruction.rest)
    return target.group(1) if instruction.opcode == "custom-call" and target else None


def _convolution_flops(instruction, shapes):
    """FLOPs of a cuDNN convolution: its forward convolution's, ``2 * outputs * kernel elements / Cout``.

    cuDNN's calls keep the forward convolution's window and ``dim_labels`` (``input_kernel->output``)
    whichever pass they compute: the forward pass (input, kernel -> output), the input's gradient
    (output gradient, kernel -> input gradient) or the kernel's (input, output gradient -> kernel
    gradient) multiply as many elements.
    """
    target = _library_call(instruction)
    labels = re.search(r"dim_labels=\w+_(\w+)->\w+", instruction.rest)
    operands = [shapes.get(name, "") for name in instruction.operands]
    if "BackwardFilter" in target:
        outputs, kernel = _dimensions(operands[1]), _dimensions(instruction.shape)
    elif "BackwardInput" in target:
        outputs, kernel = _dimensions(operands[0]), _dimensions(operands[1])
    else:
        outputs, kernel = _dimensions(instruction.shape), _dimensions(operands[1])
    if labels is None or not kernel:
        return 0
    return 2 * math.prod(outputs) * math.prod(kernel) // kernel[labels.group(1).index("o")]


def _fused_flops(computations, name):
    """FLOPs of the dots in a called computation and those it calls."""
    body = computations.get(name, [])
    shapes = {instruction.name: instruction.shape for instruction in body}
    flops = 0
    for instruction in body:
        if instruction.opcode == "dot":
            flops += _matmul_flops(instruction, shapes)
        flops += sum(_fused_flops(computations, callee) for callee in instruction.callees)
    return flops


def _operand_read(computations, kernel, index, shape):
    """Bytes `kernel` reads of its operand `index`: the sliced or gathered parts where that is all it does with it."""
    full = array_bytes(shape)
    if len(kernel.callees) != 1:
        return full
    body = computations.get(kernel.callees[0], [])
    parameter = next((i.name for i in body if i.opcode == "parameter" and i.rest.startswith(f"{index})")), None)
    uses = [i for i in body if parameter is not None and parameter in i.operands]
    if uses and all(use.opcode in _PARTIAL_READS and use.operands[0] == parameter for use in uses):
        return min(full, sum(array_bytes(use.shape) for use in uses))
    root = body[-1] if body else None  # XLA writes a computation's ROOT last
    if root is not None and root.opcode == "slice" and root.operands[0] != parameter:
        # A loop fusion computes only the elements it writes: where it slices what it computed
        # (e.g. a reduction's sum, then the slice of one image column), it reads that fraction.
        shapes = {instruction.name: instruction.shape for instruction in body}
        computed = math.prod(_dimensions(shapes.get(root.operands[0], ""))) or 1
        return full * math.prod(_dimensions(root.shape)) // computed
    return full


def kernel_costs(text):
    """The `KernelCost` of every kernel of an optimized HLO module's entry computation, in program order."""
    computations = parse_module(text)
    entry = computations["ENTRY"]
    shapes = {instruction.name: instruction.shape for instruction in entry}
    costs = []
    for kernel in entry:
        if kernel.opcode in _NO_KERNEL:
            continue
        operands = [name for name in kernel.operands if name in shapes]
        read = sum(_operand_read(computations, kernel, i, shapes[name]) for i, name in enumerate(operands))
        written = array_bytes(kernel.shape)
        first_array = _ARRAY.search(kernel.shape)
        library = _library_call(kernel) or ""
        if library.startswith(("__cublas", "__cudnn$conv")):  # cuBLAS' gemm and matmul calls, cuDNN's convolutions
            counted = _matmul_flops if library.startswith("__cublas") else _convolution_flops
            flops = counted(kernel, shapes)
            # The library call's result is (product, workspace): the workspace is scratch, not traffic.
            written = array_bytes(first_array.group(0)) if first_array else 0
        else:
            flops = sum(_fused_flops(computations, callee) for callee in kernel.callees)
        kind = re.search(r"kind=(k\w+)", kernel.rest)
        kind = "matmul" if flops else (kind.group(1) if kind else kernel.opcode)
        source = re.search(r'op_name="([^"]*)"', kernel.rest)
        costs.append(
            KernelCost(
                kernel.name,
                kind,
                read + written,
                flops,
                source.group(1) if source else "",
                first_array.group(0) if first_array else kernel.shape,
            )
        )
    return costs


def kernel_floor_s(cost, read_gbps, matmul_tflops):
    """The least time of one kernel: its bytes at the read bandwidth or its FLOPs at the matmul rate."""
    return max(cost.bytes / (read_gbps * 1e9), cost.flops / (matmul_tflops * 1e12))


def roofline(costs, read_gbps, matmul_tflops):
    """Totals of `kernel_costs`: {"kernels", "gbytes", "tflop", "floor_ms", "by_kind": {kind: {...}}}."""
    by_kind = collections.defaultdict(lambda: {"kernels": 0, "gbytes": 0.0, "tflop": 0.0, "floor_ms": 0.0})
    for cost in costs:
        entry = by_kind[cost.kind]
        entry["kernels"] += 1
        entry["gbytes"] += cost.bytes / 1e9
        entry["tflop"] += cost.flops / 1e12
        entry["floor_ms"] += kernel_floor_s(cost, read_gbps, matmul_tflops) * 1e3
    totals = {key: sum(entry[key] for entry in by_kind.values()) for key in ("kernels", "gbytes", "tflop", "floor_ms")}
    return {**totals, "by_kind": dict(sorted(by_kind.items(), key=lambda item: -item[1]["floor_ms"]))}


def largest_kernels(costs, read_gbps, matmul_tflops, count=10):
    """The `count` kernels with the largest floors, as dicts with their floor in microseconds."""
    ranked = sorted(costs, key=lambda cost: -kernel_floor_s(cost, read_gbps, matmul_tflops))[:count]
    return [
        {**dataclasses.asdict(cost), "floor_us": kernel_floor_s(cost, read_gbps, matmul_tflops) * 1e6}
        for cost in ranked
    ]
