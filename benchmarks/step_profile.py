"""Where a compiled XLA program's time goes: a `jax.profiler` trace of a few calls, each op's
time attributed to an operation kind and a phase by reading the compiled HLO.

Used by `train_step.py --profile` (and `program_size`, the program's size, by every
`train_step.py` run). Kinds (first match wins):

* `hungarian callback`: the host `pure_callback` (scipy's assignment) and its round trip;
* `dropout RNG + masks`: ops under a `Dropout` module or JAX's random-bit generation;
* `matmul`: fusions or ops holding a `dot` or `convolution`;
* `exp/log (softmax, NCE)`: transcendental elementwise ops;
* `layout copies`: only data movement (copy, transpose, broadcast, slice, concatenate, ...);
* `reductions`, `elementwise (other)`.

Phases come from the op's name stack: `optimizer` (the step's `optimizer` named scope),
`backward` (under `transpose(...)`), `forward` (everything else: model and loss).
Ops the thunk executor runs concurrently overlap in time, so the op times can add up to more
than the wall time of a call; shares are of the summed op time.
"""

from collections.abc import Callable, Mapping
import dataclasses
import glob
import math
import os
import re
import tempfile
import time
from typing import Any

import jax
from jax.extend import core as jax_core

_INSTRUCTION = re.compile(r'\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\s([a-z][\w\-]*)\((.*)$')
_COMPUTATION = re.compile(r'^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$')
_CALLED = re.compile(r'(?:calls|to_apply|body|condition)=%?([\w.\-]+)')
_CALLED_LIST = re.compile(r'(?:branch_computations|called_computations)=\{([^}]*)\}')
_OP_NAME = re.compile(r'op_name="([^"]*)"')

CONTROL = {'while', 'conditional', 'call'}
MOVES = {'copy', 'transpose', 'broadcast', 'reshape', 'bitcast', 'slice', 'dynamic-slice',
         'dynamic-update-slice', 'concatenate', 'pad', 'parameter', 'constant', 'tuple',
         'get-tuple-element', 'gather', 'scatter', 'iota', 'reverse', 'copy-start', 'copy-done'}
TRANSCENDENTAL = {'exponential', 'log', 'logistic', 'tanh', 'power', 'exponential-minus-one',
                  'log-plus-one', 'rsqrt', 'sqrt', 'erf'}
KINDS = ('matmul', 'exp/log (softmax, NCE)', 'dropout RNG + masks', 'layout copies',
         'reductions', 'elementwise (other)', 'hungarian callback')
PHASES = ('forward', 'backward', 'optimizer')


@dataclasses.dataclass
class Instruction:
  opcode: str
  op_name: str
  called: list[str]


def parse_hlo(text: str) -> tuple[dict[str, Instruction], dict[str, list[str]]]:
  """(instruction name -> Instruction, computation name -> its instructions' names)."""
  instructions: dict[str, Instruction] = {}
  computations: dict[str, list[str]] = {}
  current = None
  for line in text.splitlines():
    if line.startswith((' ', '\t')):
      match = _INSTRUCTION.match(line)
      if match and current is not None:
        name, opcode, rest = match.groups()
        called = _CALLED.findall(rest)
        for group in _CALLED_LIST.findall(rest):
          called += [c.strip().lstrip('%') for c in group.split(',') if c.strip()]
        op_name = _OP_NAME.search(rest)
        instructions[name] = Instruction(opcode, op_name.group(1) if op_name else '', called)
        computations[current].append(name)
    else:
      match = _COMPUTATION.match(line)
      if match:
        current = match.group(1)
        computations[current] = []
  return instructions, computations


def _opcodes(name: str, instructions: Mapping[str, Instruction],
             computations: Mapping[str, list[str]]) -> set[str]:
  """The opcodes `name` executes: its own, or (fusions) those of its fused computation."""
  instruction = instructions[name]
  if instruction.opcode not in ('fusion', 'custom-call') or not instruction.called:
    return {instruction.opcode}
  found = set()
  for computation in instruction.called:
    for inner in computations.get(computation, []):
      found |= _opcodes(inner, instructions, computations)
  return found


def is_dropout(op_name: str) -> bool:
  """Whether an op with this name stack is dropout: its masks or JAX's random-bit generation."""
  stack = op_name.lower()
  return 'dropout' in stack or 'random_bits' in stack or 'threefry' in stack


def kind_of(name: str, instructions: Mapping[str, Instruction],
            computations: Mapping[str, list[str]]) -> str:
  instruction = instructions[name]
  if instruction.opcode == 'custom-call' and 'callback' in name + instruction.op_name:
    return 'hungarian callback'
  if is_dropout(instruction.op_name):
    return 'dropout RNG + masks'
  ops = _opcodes(name, instructions, computations)
  if ops & {'dot', 'convolution'}:
    return 'matmul'
  if ops & TRANSCENDENTAL:
    return 'exp/log (softmax, NCE)'
  if ops <= MOVES:
    return 'layout copies'
  if ops & {'reduce', 'reduce-window', 'select-and-scatter'}:
    return 'reductions'
  return 'elementwise (other)'


def phase_of(op_name: str) -> str:
  if '/optimizer/' in op_name or op_name.endswith('/optimizer'):
    return 'optimizer'
  return 'backward' if 'transpose(' in op_name else 'forward'


def _op_events(path: str) -> list[tuple[str, float]]:
  """(hlo op name, seconds) of every XLA op event in a trace file."""
  data = jax.profiler.ProfileData.from_file(path)
  events = []
  for plane in data.planes:
    for line in plane.lines:
      for event in line.events:
        stats = dict(event.stats)
        if 'hlo_op' in stats:
          events.append((stats['hlo_op'], event.duration_ns * 1e-9))
  return events


def breakdown(compiled: Any, call: Callable[[], Any], calls: int = 3) -> dict[str, Any]:
  """Profiles `calls` calls of `call` (which runs `compiled`) and attributes the op time.

  Returns {'wall_s': median wall seconds per call, 'op_s': summed op seconds per call,
  'kinds': {kind: seconds per call}, 'phases': {phase: seconds per call},
  'unattributed_s': seconds per call of ops not found in the HLO}."""
  instructions, computations = parse_hlo(compiled.as_text())
  folder = tempfile.mkdtemp(prefix='step_profile_')
  walls = []
  with jax.profiler.trace(folder):
    for _ in range(calls):
      start = time.perf_counter()
      jax.block_until_ready(call())
      walls.append(time.perf_counter() - start)
  paths = glob.glob(os.path.join(folder, '**', '*.xplane.pb'), recursive=True)
  if not paths:
    raise RuntimeError(f'jax.profiler wrote no trace under {folder}.')
  kinds = dict.fromkeys(KINDS, 0.0)
  phases = dict.fromkeys(PHASES, 0.0)
  unattributed = 0.0
  for name, seconds in _op_events(paths[0]):
    if name not in instructions:
      unattributed += seconds
      continue
    if instructions[name].opcode in CONTROL:  # its body's ops are events of their own
      continue
    kinds[kind_of(name, instructions, computations)] += seconds / calls
    phases[phase_of(instructions[name].op_name)] += seconds / calls
  walls.sort()
  return {'wall_s': walls[len(walls) // 2], 'op_s': sum(kinds.values()), 'kinds': kinds,
          'phases': phases, 'unattributed_s': unattributed / calls}


def program_size(lowered: Any, compiled: Any) -> dict[str, Any]:
  """How big the program is (what compile time grows with): StableHLO ops of the traced
  program (all, `dot_general`s), and of the optimised HLO the fusions, while loops, custom
  calls and instructions by phase, with the dropout random-bit generation apart."""
  traced = re.findall(r'= (?:"?)([a-z]+\.[a-z_]+)', lowered.as_text())
  instructions, computations = parse_hlo(compiled.as_text())
  by_phase = dict.fromkeys(('dropout RNG + masks',) + PHASES, 0)
  for instruction in instructions.values():
    if instruction.op_name:
      by_phase['dropout RNG + masks' if is_dropout(instruction.op_name)
               else phase_of(instruction.op_name)] += 1
  opcodes = [i.opcode for i in instructions.values()]
  return {'stablehlo_ops': len(traced), 'dot_generals': traced.count('stablehlo.dot_general'),
          'fusions': opcodes.count('fusion'), 'computations': len(computations),
          'while_loops': opcodes.count('while'), 'custom_calls': opcodes.count('custom-call'),
          'instructions_by_phase': by_phase}


def _subjaxprs(params: Mapping[str, Any]) -> list[Any]:
  found = []
  for value in params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(item, jax_core.ClosedJaxpr):
        found.append(item.jaxpr)
      elif isinstance(item, jax_core.Jaxpr):
        found.append(item)
  return found


def matmul_gflop(jaxpr: Any) -> float:
  """GFLOP of the `dot_general`s of a (closed) jaxpr: 2 x output size x contracted size each,
  counted once per call of the sub-jaxprs they sit in (a `scan` body `length` times; a
  `cond` or `while` body once). Comparable with torch's `FlopCounterMode`, which counts the
  matmuls only, unlike XLA's cost analysis (every elementwise op too)."""
  jaxpr = getattr(jaxpr, 'jaxpr', jaxpr)
  flops = 0.0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      (lhs_contracting, _), _ = eqn.params['dimension_numbers']
      lhs_shape = eqn.invars[0].aval.shape
      contracted = math.prod(lhs_shape[d] for d in lhs_contracting)
      flops += 2.0 * math.prod(eqn.outvars[0].aval.shape) * contracted
      continue
    inner = [1e9 * matmul_gflop(sub) for sub in _subjaxprs(eqn.params)]
    if eqn.primitive.name == 'cond':
      flops += max(inner, default=0.0)
    elif eqn.primitive.name == 'scan':
      flops += eqn.params['length'] * sum(inner)
    else:
      flops += sum(inner)
  return flops / 1e9


def format_breakdown(result: Mapping[str, Any]) -> str:
  """A markdown table of `breakdown`'s kinds and phases, ms per call and share of op time."""
  total = result['op_s'] or 1.0
  rows = ['| where | ms per step | share of op time |', '| --- | --- | --- |']
  for title, table in (('kind', result['kinds']), ('phase', result['phases'])):
    for name, seconds in sorted(table.items(), key=lambda item: -item[1]):
      rows.append(f'| {title}: {name} | {1e3 * seconds:.0f} | {100 * seconds / total:.0f}% |')
  rows.append(f'| all ops (wall {1e3 * result["wall_s"]:.0f} ms per step) | '
              f'{1e3 * result["op_s"]:.0f} | 100% |')
  return '\n'.join(rows)
