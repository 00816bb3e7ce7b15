* Wyndor Glass as free-format-compatible fixed MPS with OBJSENSE: optimum 36
NAME          WYNDOR
OBJSENSE
    MAX
ROWS
 N  profit
 L  plant1
 L  plant2
 L  plant3
COLUMNS
    x1        profit    3.0          plant1    1.0
    x1        plant3    3.0
    x2        profit    5.0          plant2    2.0
    x2        plant3    2.0
RHS
    RHS       plant1    4.0          plant2    12.0
    RHS       plant3    18.0
ENDATA
