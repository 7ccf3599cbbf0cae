"""What the casting tests share: the bits a NaN becomes in each framework's cast to bf16
(test_cast_rounding.py measures them; test_cast_report.py checks docs/casting.md's table says them)."""

#: what a NaN becomes, by framework and length (2 values, 1024 values: a vectorised loop), for
#: +NaN and -NaN, as measured here (docs/casting.md): ml_dtypes (numpy) and XLA keep the sign;
#: torch writes 0xFFFF (FACTS.md saw 0x7FC0 from its scalar code); tensorflow keeps the sign on
#: a short tensor and drops it in its vectorised loop
NAN_BITS = {
    "numpy": {2: {(0x7FC0, 0xFFC0)}, 1024: {(0x7FC0, 0xFFC0)}},
    "jax": {2: {(0x7FC0, 0xFFC0)}, 1024: {(0x7FC0, 0xFFC0)}},
    "torch": {2: {(0xFFFF, 0xFFFF), (0x7FC0, 0x7FC0)}, 1024: {(0xFFFF, 0xFFFF)}},
    "tensorflow": {2: {(0x7FC0, 0xFFC0)}, 1024: {(0x7FC0, 0x7FC0)}},
}
