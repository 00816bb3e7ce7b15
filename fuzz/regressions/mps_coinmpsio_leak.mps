* 0-1 knapsack as a minimisation of -value with integer markers: optimum -23
NAME          KNAP4
ROWS
 N  cost
 L  weight
COLUMNS
    MARKER                 'MARKER'                 'INTORG'
    a         cost      -10.0        weight    4.0
    b         cost      -13.0        weight    6.0
    c         cost      -7.0         weight    3.0
    d         cost      -8.0         weight    5.0
    MARKER                 'MARKER'                 'INTEND'
RHS
    RHS       weight    10.0
BOUNDS
 UP BND       a         1.0
 UP BND       b         1.0
 UP BND       c         1.0
 UP BND       d         weight    
