NAME          BROKEN
ROWS
 N  obj
 L  c1
COLUMNS
    x         obj       1.0          c1        1.0
    x         nosuchrow 2.0
RHS
    RHS       c1        4.0
ENDATA
