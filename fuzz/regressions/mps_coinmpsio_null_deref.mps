NAME          BROKEN
ROWS
 N  obj
 L  c0
COLUMNS
    x         obj      'INTORG' 1.0          c1     %  1.0
    x         nosuchro'MARKER'S
    RHS       c1        4.0
ENDATA
