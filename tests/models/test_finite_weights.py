"""check_finite_weights: NaN or inf in a parameter, or NaN in a buffer, is refused naming the tensor and its count;
-inf in a buffer is a mask by design (a causal attention mask) and passes."""
import pytest
import torch
from torch import nn

from gradcache.models.finite_weights import check_finite_weights

# case -> (where the value is planted, the value, expected error fragment; None: accepted)
CASES = {
    "finite": (None, 0.0, None),
    "nan parameter": ("weight", float("nan"), r"0\.weight \(1 of 6 values\)"),
    "inf parameter": ("weight", float("inf"), r"0\.weight \(1 of 6 values\)"),
    "nan buffer": ("mask", float("nan"), r"1\.mask \(1 of 4 values\)"),
    "-inf buffer (a mask)": ("mask", float("-inf"), None),
}


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mask", torch.zeros(2, 2))


@pytest.mark.parametrize("case", CASES)
def test_non_finite_weights_are_named(case):
    where, value, fragment = CASES[case]
    model = nn.Sequential(nn.Linear(2, 3, bias=False), Masked())
    with torch.no_grad():
        if where == "weight":
            model[0].weight[1, 0] = value
        elif where == "mask":
            model[1].mask[0, 1] = value
    if fragment is None:
        check_finite_weights(model)
        return
    with pytest.raises(ValueError, match=f"weights hold NaN or inf: {fragment}"):
        check_finite_weights(model)
