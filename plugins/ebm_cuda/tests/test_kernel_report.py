"""``ebm_cuda.kernel_report.step_loop_instructions`` on hand-written machine code (nvdisasm's format): the step loop
counted from its head to its back edge, a slow path that a forward branch skips and that loops on its own left out,
a plain branch inside the loop kept. The compiled kernels' counts are checked in ``test_triton_chains.py``."""

from ebm_cuda.kernel_report import step_loop_instructions


def _sass(lines: list[str]) -> str:
    """nvdisasm-style text: labels as given, each instruction with an address comment."""
    out, address = [], 0
    for line in lines:
        if line.endswith(":"):
            out.append(line)
        else:
            out.append(f"        /*{address:04x}*/                   {line} ;")
            address += 16
    return "\n".join(out)


PROLOGUE = ["S2R R0, SR_TID.X", "MOV R1, c[0x0][0x28]"]
EPILOGUE = ["STG.E desc[UR4][R2.64], R5", "EXIT", ".L_x_9:", "BRA `(.L_x_9)", "NOP"]


def test_the_loop_body_is_counted_from_its_head_to_its_back_edge():
    body = ["FFMA R1, R2, R3, R1", "FFMA R4, R2, R3, R4", "ISETP.NE.AND P0, PT, R5, RZ, PT"]
    sass = _sass(PROLOGUE + [".L_x_0:"] + body + ["@P0 BRA `(.L_x_0)"] + EPILOGUE)
    assert step_loop_instructions(sass) == len(body) + 1  # the back edge too; the trap loop after EXIT is no step loop


def test_a_skipped_slow_path_with_a_loop_of_its_own_is_left_out_and_a_plain_branch_kept():
    slow_path = [
        "MOV R6, RZ",
        ".L_x_3:",
        "LDG.E.CONSTANT R7, desc[UR4][R8.64]",
        "IADD3 R6, R6, 0x1, RZ",
        "@P1 BRA `(.L_x_3)",
        "MOV R9, R6",
    ]
    plain = ["@P2 BRA `(.L_x_5)", "FMUL R1, R1, R1", ".L_x_5:"]
    body = ["FFMA R1, R2, R3, R1", "@!P3 BRA `(.L_x_4)"] + slow_path + [".L_x_4:", "MUFU.SIN R2, R1"] + plain
    sass = _sass(PROLOGUE + [".L_x_0:"] + body + ["@P0 BRA `(.L_x_0)"] + EPILOGUE)
    # counted: FFMA, the forward branch, MUFU.SIN, the plain branch, FMUL, the back edge
    assert step_loop_instructions(sass) == 6


def test_code_without_a_loop_has_no_step_loop():
    assert step_loop_instructions(_sass(PROLOGUE + ["@P0 BRA `(.L_x_1)", "NOP", ".L_x_1:", "EXIT"])) is None
