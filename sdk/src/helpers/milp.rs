//! A small mixed-integer linear program solver: branch and bound over a
//! bounded-variable simplex, in plain `std` Rust so it runs inside the policy
//! sandbox.
//!
//! * [`Problem`] holds variables (bounds, integrality, objective coefficient) and
//!   linear constraints (`≤`, `≥`, `=`).
//! * [`solve`] runs depth-first branch and bound. The root relaxation is solved by a
//!   two-phase primal simplex; every other node re-uses the single tableau and
//!   restores feasibility with the dual simplex after its bound changes, so a node
//!   costs a handful of pivots.
//! * [`Budget`] stops the search after a number of nodes or pivots, or at a
//!   deadline read from a caller-supplied clock. A policy cannot read the wall clock:
//!   it passes the host's `now` (wall time when serving, virtual time in the
//!   simulator) or relies on the node and pivot budgets, which are deterministic.
//! * A warm start (a known feasible point, e.g. the previous plan) becomes the first
//!   incumbent, so a search cut short still returns at least that point.
//!
//! The tableau is dense: the solver is meant for problems of a few hundred rows and
//! columns, which is what a per-cluster resource plan needs.

/// Index of a variable in a [`Problem`].
pub type Var = usize;

/// Whether the objective is minimised or maximised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sense {
    /// Smallest objective value.
    Minimize,
    /// Largest objective value.
    Maximize,
}

/// The relation of a constraint's left side to its right side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relation {
    /// `Σ a·x ≤ rhs`.
    Le,
    /// `Σ a·x ≥ rhs`.
    Ge,
    /// `Σ a·x = rhs`.
    Eq,
}

/// One linear constraint.
#[derive(Clone, Debug, PartialEq)]
pub struct Constraint {
    /// Coefficients by variable (a variable may appear once).
    pub terms: Vec<(Var, f64)>,
    /// The relation.
    pub relation: Relation,
    /// The right-hand side.
    pub rhs: f64,
}

/// A mixed-integer linear program. Every variable needs a finite lower bound.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    sense: Sense,
    objective: Vec<f64>,
    lower: Vec<f64>,
    upper: Vec<f64>,
    integer: Vec<bool>,
    constraints: Vec<Constraint>,
}

/// How a solve ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The returned point is optimal (within the gap).
    Optimal,
    /// The budget ran out; the returned point is the best feasible one found.
    Feasible,
    /// No feasible point exists.
    Infeasible,
    /// The relaxation is unbounded.
    Unbounded,
    /// The budget ran out before any feasible point was found.
    NoSolution,
}

/// The result of [`solve`].
#[derive(Clone, Debug, PartialEq)]
pub struct Solution {
    /// How the search ended.
    pub status: Status,
    /// Variable values (empty unless a point was found).
    pub values: Vec<f64>,
    /// Objective value of `values` (NaN when there is none).
    pub objective: f64,
    /// Branch-and-bound nodes explored.
    pub nodes: u64,
    /// Simplex pivots (and bound flips) made.
    pub pivots: u64,
}

impl Solution {
    /// True when `values` holds a feasible point (optimal or not).
    pub fn has_point(&self) -> bool {
        matches!(self.status, Status::Optimal | Status::Feasible)
    }
}

/// When to stop searching.
pub struct Budget<'a> {
    /// Most branch-and-bound nodes.
    pub max_nodes: u64,
    /// Most simplex pivots in all.
    pub max_pivots: u64,
    /// Relative optimality gap at which a node is pruned (0 proves optimality).
    pub relative_gap: f64,
    /// Pause once `clock()` reaches the instant (same unit as the clock).
    pub deadline: Option<(u64, &'a dyn Fn() -> u64)>,
    /// Pause after this much work in one [`Search::run`] call (tableau entries
    /// touched; about one WebAssembly instruction each).
    pub slice_work: u64,
}

impl Default for Budget<'_> {
    fn default() -> Self {
        Self { max_nodes: 100_000, max_pivots: 10_000_000, relative_gap: 1e-9, deadline: None, slice_work: u64::MAX }
    }
}

/// Feasibility tolerance on constraints and bounds.
const FEAS_TOL: f64 = 1e-7;
/// Distance from an integer below which a value counts as integral.
const INT_TOL: f64 = 1e-6;
/// Reduced costs smaller than this count as zero.
const PIVOT_TOL: f64 = 1e-9;
/// Pivot elements smaller than this are never pivoted on (numerical safety).
const ALPHA_TOL: f64 = 1e-7;

impl Problem {
    /// An empty problem.
    pub fn new(sense: Sense) -> Self {
        Self { sense, objective: Vec::new(), lower: Vec::new(), upper: Vec::new(), integer: Vec::new(), constraints: Vec::new() }
    }

    /// Add a variable with bounds `[lower, upper]` (upper may be infinite), integral
    /// or not, with objective coefficient `cost`; returns its index.
    ///
    /// # Panics
    /// If `lower` is not finite or exceeds `upper`.
    pub fn add_var(&mut self, lower: f64, upper: f64, integer: bool, cost: f64) -> Var {
        assert!(lower.is_finite() && lower <= upper, "variable bounds must be finite below and ordered: [{lower}, {upper}]");
        self.objective.push(cost);
        self.lower.push(lower);
        self.upper.push(upper);
        self.integer.push(integer);
        self.objective.len() - 1
    }

    /// Add a constraint `Σ terms relation rhs`.
    pub fn add_constraint(&mut self, terms: Vec<(Var, f64)>, relation: Relation, rhs: f64) {
        debug_assert!(terms.iter().all(|(v, _)| *v < self.objective.len()), "constraint names an unknown variable");
        self.constraints.push(Constraint { terms, relation, rhs });
    }

    /// Number of variables.
    pub fn var_count(&self) -> usize {
        self.objective.len()
    }

    /// The constraints.
    pub fn constraints(&self) -> &[Constraint] {
        &self.constraints
    }

    /// A variable's bounds.
    pub fn bounds(&self, var: Var) -> (f64, f64) {
        (self.lower[var], self.upper[var])
    }

    /// Change a variable's bounds (e.g. to fix it).
    ///
    /// # Panics
    /// If `lower` is not finite or exceeds `upper`.
    pub fn set_bounds(&mut self, var: Var, lower: f64, upper: f64) {
        assert!(lower.is_finite() && lower <= upper, "variable bounds must be finite below and ordered: [{lower}, {upper}]");
        self.lower[var] = lower;
        self.upper[var] = upper;
    }

    /// A variable's objective coefficient.
    pub fn objective_coefficient(&self, var: Var) -> f64 {
        self.objective[var]
    }

    /// Whether a variable is integral.
    pub fn is_integer(&self, var: Var) -> bool {
        self.integer[var]
    }

    /// The objective sense.
    pub fn sense(&self) -> Sense {
        self.sense
    }

    /// Objective value of a point.
    pub fn objective_value(&self, values: &[f64]) -> f64 {
        self.objective.iter().zip(values).map(|(c, x)| c * x).sum()
    }

    /// Whether a point meets every bound, integrality and constraint (within `tol`).
    pub fn is_feasible(&self, values: &[f64], tol: f64) -> bool {
        if values.len() != self.var_count() {
            return false;
        }
        for (j, &x) in values.iter().enumerate() {
            if !x.is_finite() || x < self.lower[j] - tol || x > self.upper[j] + tol {
                return false;
            }
            if self.integer[j] && (x - x.round()).abs() > tol.max(INT_TOL) {
                return false;
            }
        }
        self.constraints.iter().all(|c| {
            let lhs: f64 = c.terms.iter().map(|(v, a)| a * values[*v]).sum();
            let scale = 1.0 + c.rhs.abs();
            match c.relation {
                Relation::Le => lhs <= c.rhs + tol * scale,
                Relation::Ge => lhs >= c.rhs - tol * scale,
                Relation::Eq => (lhs - c.rhs).abs() <= tol * scale,
            }
        })
    }

    /// Whether `a` is a strictly better objective value than `b` for this sense.
    fn better(&self, a: f64, b: f64) -> bool {
        match self.sense {
            Sense::Minimize => a < b,
            Sense::Maximize => a > b,
        }
    }
}

/// Solve the linear relaxation only (integrality ignored).
pub fn solve_relaxation(problem: &Problem, max_pivots: u64) -> Solution {
    let mut lp = Tableau::new(problem);
    let mut pivots_left = max_pivots;
    let status = lp.solve_root(&mut pivots_left);
    let pivots = max_pivots - pivots_left;
    match status {
        LpStatus::Optimal => {
            let values = lp.structural_values();
            Solution { status: Status::Optimal, objective: problem.objective_value(&values), values, nodes: 1, pivots }
        }
        LpStatus::Infeasible => empty(Status::Infeasible, 1, pivots),
        LpStatus::Unbounded => empty(Status::Unbounded, 1, pivots),
        LpStatus::OutOfPivots => empty(Status::NoSolution, 1, pivots),
    }
}

fn empty(status: Status, nodes: u64, pivots: u64) -> Solution {
    Solution { status, values: Vec::new(), objective: f64::NAN, nodes, pivots }
}

/// Solve a mixed-integer program by branch and bound within `budget`, starting from
/// `warm_start` as the incumbent when it is feasible. A deadline or work slice that
/// runs out ends the search with the best point found.
pub fn solve(problem: &Problem, budget: &Budget, warm_start: Option<&[f64]>) -> Solution {
    let mut search = Search::new(problem.clone(), warm_start);
    match search.run(budget) {
        Some(solution) => solution,
        None => search.stop(),
    }
}

/// Where the root relaxation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Root {
    Pending,
    Solved,
}

/// A branch-and-bound search that can be run in slices (one per host call, say)
/// and resumed where it stopped.
pub struct Search {
    problem: Problem,
    lp: Tableau,
    ints: Vec<Var>,
    /// Open nodes (bounds of the integer variables), depth first.
    stack: Vec<Vec<(f64, f64)>>,
    incumbent: Option<(Vec<f64>, f64)>,
    root: Root,
    nodes: u64,
    pivots: u64,
    finished: Option<Solution>,
}

impl Search {
    /// A search of `problem`, with `warm_start` as the first incumbent if feasible.
    pub fn new(problem: Problem, warm_start: Option<&[f64]>) -> Self {
        let mut incumbent = None;
        if let Some(point) = warm_start {
            if problem.is_feasible(point, FEAS_TOL) {
                let point: Vec<f64> = point.iter().enumerate().map(|(j, x)| if problem.integer[j] { x.round() } else { *x }).collect();
                incumbent = Some((point.clone(), problem.objective_value(&point)));
            }
        }
        let lp = Tableau::new(&problem);
        let ints: Vec<Var> = (0..problem.var_count()).filter(|&j| problem.integer[j]).collect();
        let root_bounds = ints.iter().map(|&j| (problem.lower[j], problem.upper[j])).collect();
        Self { problem, lp, ints, stack: vec![root_bounds], incumbent, root: Root::Pending, nodes: 0, pivots: 0, finished: None }
    }

    /// Nodes explored so far.
    pub fn nodes(&self) -> u64 {
        self.nodes
    }

    /// Pivots made so far.
    pub fn pivots(&self) -> u64 {
        self.pivots
    }

    /// Arithmetic work done so far (tableau entries touched), the unit of
    /// [`Budget::slice_work`].
    pub fn work(&self) -> u64 {
        self.lp.work
    }

    /// The best point found so far and its objective value.
    pub fn incumbent(&self) -> Option<(&[f64], f64)> {
        self.incumbent.as_ref().map(|(v, o)| (v.as_slice(), *o))
    }

    /// The problem being solved.
    pub fn problem(&self) -> &Problem {
        &self.problem
    }

    /// End the search now with the best point found.
    pub fn stop(&mut self) -> Solution {
        if let Some(done) = &self.finished {
            return done.clone();
        }
        let solution = self.conclude(false);
        self.finished = Some(solution.clone());
        solution
    }

    fn conclude(&self, complete: bool) -> Solution {
        match &self.incumbent {
            Some((values, objective)) => Solution {
                status: if complete { Status::Optimal } else { Status::Feasible },
                values: values.clone(),
                objective: *objective,
                nodes: self.nodes,
                pivots: self.pivots,
            },
            None => empty(if complete { Status::Infeasible } else { Status::NoSolution }, self.nodes, self.pivots),
        }
    }

    /// Continue the search. Returns the solution once it is finished (proved, or
    /// out of its total node or pivot budget), or `None` when this call's slice of
    /// work or the deadline ran out first: call again to resume.
    pub fn run(&mut self, budget: &Budget) -> Option<Solution> {
        if let Some(done) = &self.finished {
            return Some(done.clone());
        }
        self.lp.work_limit = self.lp.work.saturating_add(budget.slice_work);
        let result = self.advance(budget);
        if let Some(solution) = &result {
            self.finished = Some(solution.clone());
        }
        result
    }

    fn pivots_left(&self, budget: &Budget) -> u64 {
        budget.max_pivots.saturating_sub(self.pivots)
    }

    fn advance(&mut self, budget: &Budget) -> Option<Solution> {
        if self.root == Root::Pending {
            let mut left = self.pivots_left(budget);
            let before = left;
            let status = self.lp.solve_root(&mut left);
            self.pivots += before - left;
            match status {
                LpStatus::Optimal => self.root = Root::Solved,
                LpStatus::Infeasible => return Some(empty(Status::Infeasible, 1, self.pivots)),
                LpStatus::Unbounded => return Some(empty(Status::Unbounded, 1, self.pivots)),
                LpStatus::OutOfPivots if left == 0 => return Some(self.conclude(false)),
                LpStatus::OutOfPivots => return None,
            }
        }
        while let Some(bounds) = self.stack.pop() {
            if self.nodes >= budget.max_nodes || self.pivots_left(budget) == 0 {
                self.stack.push(bounds);
                return Some(self.conclude(false));
            }
            if self.lp.work >= self.lp.work_limit || budget.deadline.is_some_and(|(at, clock)| clock() >= at) {
                self.stack.push(bounds);
                return None;
            }
            self.nodes += 1;
            for (slot, &j) in self.ints.iter().enumerate() {
                self.lp.set_bounds(j, bounds[slot].0, bounds[slot].1);
            }
            // Internally the LP minimises; `cutoff` is the incumbent in that sign.
            let cutoff = self.incumbent.as_ref().map(|(_, obj)| {
                let internal = self.lp.internal(*obj);
                internal - budget.relative_gap * internal.abs().max(1.0) - 1e-12
            });
            let ready = if self.nodes % 16 == 1 { self.lp.refresh() } else { self.lp.restore_dual_feasibility() };
            let mut left = self.pivots_left(budget);
            let before = left;
            let status = if ready {
                self.lp.dual_simplex(&mut left, cutoff)
            } else {
                // Rare: a loosened unbounded column broke dual feasibility; start over.
                let mut bounded = self.problem.clone();
                for (slot, &j) in self.ints.iter().enumerate() {
                    (bounded.lower[j], bounded.upper[j]) = bounds[slot];
                }
                let (work, limit) = (self.lp.work, self.lp.work_limit);
                self.lp = Tableau::new(&bounded);
                self.lp.work = work;
                self.lp.work_limit = limit;
                self.lp.solve_root(&mut left)
            };
            self.pivots += before - left;
            match status {
                LpStatus::Optimal => {}
                LpStatus::OutOfPivots => {
                    // Resume this node later (or conclude if the total budget is spent).
                    self.nodes -= 1;
                    self.stack.push(bounds);
                    if left == 0 {
                        return Some(self.conclude(false));
                    }
                    return None;
                }
                LpStatus::Infeasible | LpStatus::Unbounded => continue,
            }
            let bound = self.lp.objective();
            if cutoff.is_some_and(|c| bound >= c) {
                continue;
            }
            // Branch on the most fractional integer variable.
            let mut branch: Option<(usize, f64, f64)> = None;
            for (slot, &j) in self.ints.iter().enumerate() {
                let x = self.lp.x[j];
                let frac = (x - x.floor()).min(x.ceil() - x);
                if frac > INT_TOL && branch.is_none_or(|(_, _, best)| frac > best + 1e-12) {
                    branch = Some((slot, x, frac));
                }
            }
            match branch {
                None => {
                    let mut values = self.lp.structural_values();
                    for &j in &self.ints {
                        values[j] = values[j].round();
                    }
                    if self.problem.is_feasible(&values, 1e-6) {
                        let obj = self.problem.objective_value(&values);
                        if self.incumbent.as_ref().is_none_or(|(_, best)| self.problem.better(obj, *best)) {
                            self.incumbent = Some((values, obj));
                        }
                    }
                }
                Some((slot, x, _)) => {
                    let mut down = bounds.clone();
                    down[slot].1 = x.floor();
                    let mut up = bounds;
                    up[slot].0 = x.ceil();
                    // Explore first the side the relaxation leans to.
                    if x - x.floor() >= 0.5 {
                        self.stack.push(down);
                        self.stack.push(up);
                    } else {
                        self.stack.push(up);
                        self.stack.push(down);
                    }
                }
            }
        }
        Some(self.conclude(true))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LpStatus {
    Optimal,
    Infeasible,
    Unbounded,
    OutOfPivots,
}

/// A dense simplex tableau over structural, slack and artificial columns, with
/// every variable bounded below (and possibly above). Internally it minimises.
struct Tableau {
    rows: usize,
    cols: usize,
    structural: usize,
    /// Row-major `rows × cols`: `B⁻¹A`.
    t: Vec<f64>,
    /// Right-hand sides (rows with `≥` are negated into `≤`).
    b: Vec<f64>,
    /// Phase-2 costs (negated for maximisation), zero beyond the structurals.
    cost: Vec<f64>,
    /// Costs of the phase being run.
    phase_cost: Vec<f64>,
    /// Reduced costs of `phase_cost`.
    d: Vec<f64>,
    lower: Vec<f64>,
    upper: Vec<f64>,
    x: Vec<f64>,
    basis: Vec<usize>,
    /// Row of a basic column, `usize::MAX` for a nonbasic one.
    row_of: Vec<usize>,
    /// Nonbasic columns sitting at their upper bound.
    at_upper: Vec<bool>,
    negate: bool,
    /// Scratch: nonzero columns of the pivot row.
    nonzero: Vec<usize>,
    /// Work done (tableau entries touched).
    work: u64,
    /// The simplex stops (as out of pivots) once `work` reaches this.
    work_limit: u64,
    /// Root progress: 0 before phase 1, 1 in phase 1, 2 in phase 2.
    root_phase: u8,
}

impl Tableau {
    fn new(problem: &Problem) -> Self {
        let n = problem.var_count();
        let m = problem.constraints.len();
        let negate = problem.sense == Sense::Maximize;
        // Structural columns start at their lower bound; a row whose slack would
        // start outside its bounds gets an artificial column.
        let mut residual = Vec::with_capacity(m);
        let mut b = Vec::with_capacity(m);
        let mut flip = Vec::with_capacity(m);
        for c in &problem.constraints {
            let sign = if c.relation == Relation::Ge { -1.0 } else { 1.0 };
            let activity: f64 = c.terms.iter().map(|(v, a)| a * problem.lower[*v]).sum();
            flip.push(sign);
            b.push(sign * c.rhs);
            residual.push(sign * (c.rhs - activity));
        }
        let needs_art: Vec<bool> = problem
            .constraints
            .iter()
            .zip(&residual)
            .map(|(c, r)| c.relation == Relation::Eq && r.abs() > 0.0 || c.relation != Relation::Eq && *r < 0.0)
            .collect();
        let arts = needs_art.iter().filter(|a| **a).count();
        let cols = n + m + arts;
        let mut t = vec![0.0; m * cols];
        let mut lower = problem.lower.clone();
        let mut upper = problem.upper.clone();
        let mut x = problem.lower.clone();
        let mut cost: Vec<f64> = problem.objective.iter().map(|c| if negate { -c } else { *c }).collect();
        let mut basis = vec![0; m];
        let mut row_of = vec![usize::MAX; cols];
        for (i, c) in problem.constraints.iter().enumerate() {
            for (v, a) in &c.terms {
                t[i * cols + v] += flip[i] * a;
            }
            t[i * cols + n + i] = 1.0;
            lower.push(0.0);
            upper.push(if c.relation == Relation::Eq { 0.0 } else { f64::INFINITY });
            x.push(0.0);
            cost.push(0.0);
        }
        let mut art = n + m;
        for i in 0..m {
            if needs_art[i] {
                let sigma = residual[i].signum();
                t[i * cols + art] = sigma;
                // Scale the row so the artificial's column is the unit vector.
                for v in &mut t[i * cols..(i + 1) * cols] {
                    *v *= sigma;
                }
                lower.push(0.0);
                upper.push(f64::INFINITY);
                x.push(residual[i].abs());
                cost.push(0.0);
                basis[i] = art;
                row_of[art] = i;
                art += 1;
            } else {
                basis[i] = n + i;
                row_of[n + i] = i;
                x[n + i] = residual[i];
            }
        }
        Self {
            rows: m,
            cols,
            structural: n,
            t,
            b,
            phase_cost: cost.clone(),
            d: vec![0.0; cols],
            cost,
            lower,
            upper,
            x,
            basis,
            row_of,
            at_upper: vec![false; cols],
            negate,
            nonzero: Vec::with_capacity(cols),
            work: 0,
            work_limit: u64::MAX,
            root_phase: 0,
        }
    }

    fn internal(&self, objective: f64) -> f64 {
        if self.negate {
            -objective
        } else {
            objective
        }
    }

    fn objective(&self) -> f64 {
        self.cost.iter().zip(&self.x).map(|(c, x)| c * x).sum()
    }

    fn structural_values(&self) -> Vec<f64> {
        self.x[..self.structural].to_vec()
    }

    /// Phase 1 (drive the artificials to zero), then phase 2, both primal; resumes
    /// where an earlier call ran out of pivots.
    fn solve_root(&mut self, pivots_left: &mut u64) -> LpStatus {
        let first_art = self.structural + self.rows;
        if self.root_phase == 0 {
            if self.cols > first_art {
                let mut phase1 = vec![0.0; self.cols];
                for c in &mut phase1[first_art..] {
                    *c = 1.0;
                }
                self.phase_cost = phase1;
                self.reduced_costs();
                self.root_phase = 1;
            } else {
                self.start_phase_two();
            }
        }
        if self.root_phase == 1 {
            match self.primal_simplex(pivots_left) {
                LpStatus::Optimal => {}
                other => return other,
            }
            let infeasibility: f64 = self.x[first_art..].iter().sum();
            if infeasibility > FEAS_TOL * (1.0 + self.b.iter().map(|v| v.abs()).fold(0.0, f64::max)) {
                return LpStatus::Infeasible;
            }
            // Artificials are fixed at zero from now on.
            for j in first_art..self.cols {
                self.upper[j] = 0.0;
                if self.row_of[j] == usize::MAX {
                    self.x[j] = 0.0;
                    self.at_upper[j] = false;
                }
            }
            self.start_phase_two();
        }
        self.primal_simplex(pivots_left)
    }

    fn start_phase_two(&mut self) {
        self.phase_cost = self.cost.clone();
        self.reduced_costs();
        self.root_phase = 2;
    }

    fn reduced_costs(&mut self) {
        let cols = self.cols;
        self.work += (self.rows * cols) as u64;
        self.d.copy_from_slice(&self.phase_cost);
        for r in 0..self.rows {
            let cb = self.phase_cost[self.basis[r]];
            if cb != 0.0 {
                let row = &self.t[r * cols..(r + 1) * cols];
                for (d, a) in self.d.iter_mut().zip(row) {
                    *d -= cb * a;
                }
            }
        }
        for r in 0..self.rows {
            self.d[self.basis[r]] = 0.0;
        }
    }

    /// Change a variable's bounds; a nonbasic one stays on the same side, and the
    /// basic values follow it.
    fn set_bounds(&mut self, j: Var, lower: f64, upper: f64) {
        self.lower[j] = lower;
        self.upper[j] = upper;
        if self.row_of[j] == usize::MAX {
            self.at_upper[j] = self.at_upper[j] && upper.is_finite();
            let target = if self.at_upper[j] { upper } else { lower };
            let delta = target - self.x[j];
            if delta != 0.0 {
                self.shift(j, delta);
            }
            self.x[j] = target;
        }
    }

    /// Put every nonbasic column on the bound its reduced cost asks for (bounds
    /// fixed at one node may be loose at the next). False when a column would need
    /// an infinite bound (the basis is not dual feasible).
    fn restore_dual_feasibility(&mut self) -> bool {
        for j in 0..self.cols {
            if self.row_of[j] != usize::MAX || self.upper[j] <= self.lower[j] {
                continue;
            }
            let flip_up = self.d[j] < -PIVOT_TOL && !self.at_upper[j];
            let flip_down = self.d[j] > PIVOT_TOL && self.at_upper[j];
            if flip_up && !self.upper[j].is_finite() {
                return false;
            }
            if flip_up || flip_down {
                self.at_upper[j] = flip_up;
                let target = if flip_up { self.upper[j] } else { self.lower[j] };
                let delta = target - self.x[j];
                self.shift(j, delta);
                self.x[j] = target;
            }
        }
        true
    }

    /// Recompute the reduced costs, put every nonbasic column on the bound its
    /// reduced cost asks for (dual feasibility; bounds that were fixed at a node may
    /// have been loosened since), and recompute the basic values from the nonbasic
    /// ones (`x_B = B⁻¹b − Σ T_j x_j`, with `B⁻¹` read off the slack columns), which
    /// also removes drift accumulated over many pivots. False when a column would
    /// need an infinite bound (the basis is not dual feasible).
    fn refresh(&mut self) -> bool {
        let cols = self.cols;
        self.work += (self.rows * (cols + self.rows)) as u64;
        let n = self.structural;
        self.reduced_costs();
        let mut dual_feasible = true;
        for j in 0..cols {
            if self.row_of[j] != usize::MAX || self.upper[j] <= self.lower[j] {
                if self.row_of[j] == usize::MAX {
                    self.x[j] = self.lower[j];
                    self.at_upper[j] = false;
                }
                continue;
            }
            if self.d[j] < -PIVOT_TOL {
                if self.upper[j].is_finite() {
                    self.at_upper[j] = true;
                } else {
                    dual_feasible = false;
                }
            } else if self.d[j] > PIVOT_TOL {
                self.at_upper[j] = false;
            }
            self.x[j] = if self.at_upper[j] { self.upper[j] } else { self.lower[j] };
        }
        for r in 0..self.rows {
            let row = &self.t[r * cols..(r + 1) * cols];
            let mut value: f64 = (0..self.rows).map(|i| row[n + i] * self.b[i]).sum();
            for (j, a) in row.iter().enumerate() {
                if self.row_of[j] == usize::MAX && *a != 0.0 {
                    value -= a * self.x[j];
                }
            }
            self.x[self.basis[r]] = value;
        }
        dual_feasible
    }

    fn pivot(&mut self, r: usize, j: usize) {
        let cols = self.cols;
        let p = self.t[r * cols + j];
        for v in &mut self.t[r * cols..(r + 1) * cols] {
            *v /= p;
        }
        let (before, rest) = self.t.split_at_mut(r * cols);
        let (pivot_row, after) = rest.split_at_mut(cols);
        // Eliminate over the pivot row's nonzeros only (the tableau stays sparse).
        self.nonzero.clear();
        self.nonzero.extend(pivot_row.iter().enumerate().filter(|(_, v)| **v != 0.0).map(|(c, _)| c));
        self.work += (cols + self.rows * (1 + self.nonzero.len())) as u64;
        for row in before.chunks_exact_mut(cols).chain(after.chunks_exact_mut(cols)) {
            let factor = row[j];
            if factor != 0.0 {
                for &c in &self.nonzero {
                    row[c] -= factor * pivot_row[c];
                }
                row[j] = 0.0;
            }
        }
        let factor = self.d[j];
        if factor != 0.0 {
            for &c in &self.nonzero {
                self.d[c] -= factor * pivot_row[c];
            }
            self.d[j] = 0.0;
        }
        let leaving = self.basis[r];
        self.row_of[leaving] = usize::MAX;
        self.basis[r] = j;
        self.row_of[j] = r;
        self.at_upper[j] = false;
    }

    /// Move nonbasic `j` by `delta`, updating the basic values.
    fn shift(&mut self, j: usize, delta: f64) {
        self.work += self.rows as u64;
        self.x[j] += delta;
        for r in 0..self.rows {
            let a = self.t[r * self.cols + j];
            if a != 0.0 {
                self.x[self.basis[r]] -= a * delta;
            }
        }
    }

    fn primal_simplex(&mut self, pivots_left: &mut u64) -> LpStatus {
        let mut degenerate_run = 0u32;
        // At least one step per call, so a sliced search always progresses.
        let mut first = true;
        loop {
            if *pivots_left == 0 || (!first && self.work >= self.work_limit) {
                return LpStatus::OutOfPivots;
            }
            first = false;
            self.work += (self.cols + self.rows) as u64;
            // Entering column: Dantzig's rule, Bland's after a run of degenerate steps.
            let bland = degenerate_run > 50;
            let mut entering: Option<(usize, f64)> = None;
            let mut best = 0.0;
            for j in 0..self.cols {
                if self.row_of[j] != usize::MAX || self.upper[j] - self.lower[j] <= 0.0 {
                    continue;
                }
                let dj = self.d[j];
                let dir = if !self.at_upper[j] && dj < -PIVOT_TOL {
                    1.0
                } else if self.at_upper[j] && dj > PIVOT_TOL {
                    -1.0
                } else {
                    continue;
                };
                if bland {
                    entering = Some((j, dir));
                    break;
                }
                if dj.abs() > best {
                    best = dj.abs();
                    entering = Some((j, dir));
                }
            }
            let Some((j, dir)) = entering else { return LpStatus::Optimal };
            // Ratio test.
            let mut step = self.upper[j] - self.lower[j];
            let mut leaving: Option<(usize, bool)> = None;
            let mut leaving_size = 0.0;
            for r in 0..self.rows {
                let a = self.t[r * self.cols + j] * dir;
                let bvar = self.basis[r];
                let (limit, to_upper) = if a > ALPHA_TOL {
                    ((self.x[bvar] - self.lower[bvar]).max(0.0) / a, false)
                } else if a < -ALPHA_TOL {
                    if !self.upper[bvar].is_finite() {
                        continue;
                    }
                    ((self.upper[bvar] - self.x[bvar]).max(0.0) / -a, true)
                } else {
                    continue;
                };
                let better = limit < step - 1e-12 || (limit <= step + 1e-12 && leaving.is_some() && a.abs() > leaving_size && !bland);
                if better {
                    step = limit;
                    leaving = Some((r, to_upper));
                    leaving_size = a.abs();
                }
            }
            if !step.is_finite() {
                return LpStatus::Unbounded;
            }
            *pivots_left -= 1;
            degenerate_run = if step <= 1e-12 { degenerate_run + 1 } else { 0 };
            self.shift(j, dir * step);
            match leaving {
                None => {
                    // Bound flip.
                    self.at_upper[j] = dir > 0.0;
                    self.x[j] = if dir > 0.0 { self.upper[j] } else { self.lower[j] };
                }
                Some((r, to_upper)) => {
                    let out = self.basis[r];
                    self.pivot(r, j);
                    self.at_upper[out] = to_upper;
                    self.x[out] = if to_upper { self.upper[out] } else { self.lower[out] };
                }
            }
        }
    }

    /// Restore primal feasibility from a dual-feasible basis; stops early once the
    /// objective reaches `cutoff` (the node cannot beat the incumbent).
    fn dual_simplex(&mut self, pivots_left: &mut u64, cutoff: Option<f64>) -> LpStatus {
        // At least one step per call, so a sliced search always progresses.
        let mut first = true;
        loop {
            if *pivots_left == 0 || (!first && self.work >= self.work_limit) {
                return LpStatus::OutOfPivots;
            }
            first = false;
            self.work += (2 * self.cols + self.rows) as u64;
            if cutoff.is_some_and(|c| self.objective() >= c) {
                return LpStatus::Optimal;
            }
            // Leaving row: the largest bound violation.
            let mut leaving: Option<(usize, f64, bool)> = None;
            let mut worst = FEAS_TOL;
            for r in 0..self.rows {
                let v = self.basis[r];
                let below = self.lower[v] - self.x[v];
                let above = self.x[v] - self.upper[v];
                if below > worst {
                    worst = below;
                    leaving = Some((r, self.lower[v], false));
                } else if above > worst {
                    worst = above;
                    leaving = Some((r, self.upper[v], true));
                }
            }
            let Some((r, target, to_upper)) = leaving else { return LpStatus::Optimal };
            let increase = !to_upper;
            let mut entering: Option<usize> = None;
            let mut best_ratio = f64::INFINITY;
            let mut best_size = 0.0;
            for j in 0..self.cols {
                if self.row_of[j] != usize::MAX || self.upper[j] - self.lower[j] <= 0.0 {
                    continue;
                }
                let alpha = self.t[r * self.cols + j];
                if alpha.abs() <= ALPHA_TOL {
                    continue;
                }
                // x_r changes by −alpha·Δx_j; nonbasic at lower can only rise.
                let eligible = if self.at_upper[j] { (alpha > 0.0) == increase } else { (alpha < 0.0) == increase };
                if !eligible {
                    continue;
                }
                let ratio = self.d[j].abs() / alpha.abs();
                if ratio < best_ratio - 1e-12 || (ratio <= best_ratio + 1e-12 && alpha.abs() > best_size) {
                    best_ratio = ratio;
                    best_size = alpha.abs();
                    entering = Some(j);
                }
            }
            let Some(j) = entering else { return LpStatus::Infeasible };
            *pivots_left -= 1;
            let out = self.basis[r];
            let alpha = self.t[r * self.cols + j];
            let delta = (self.x[out] - target) / alpha;
            self.shift(j, delta);
            self.pivot(r, j);
            self.at_upper[out] = to_upper;
            self.x[out] = target;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::helpers::test_rng::XorShift;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * (1.0 + a.abs().max(b.abs()))
    }

    #[test]
    fn solves_a_textbook_lp() {
        // max 3x + 5y s.t. x ≤ 4, 2y ≤ 12, 3x + 2y ≤ 18 → (2, 6), 36.
        let mut p = Problem::new(Sense::Maximize);
        let x = p.add_var(0.0, f64::INFINITY, false, 3.0);
        let y = p.add_var(0.0, f64::INFINITY, false, 5.0);
        p.add_constraint(vec![(x, 1.0)], Relation::Le, 4.0);
        p.add_constraint(vec![(y, 2.0)], Relation::Le, 12.0);
        p.add_constraint(vec![(x, 3.0), (y, 2.0)], Relation::Le, 18.0);
        let s = solve_relaxation(&p, 1000);
        assert_eq!(s.status, Status::Optimal);
        assert!(close(s.objective, 36.0), "{s:?}");
        assert!(close(s.values[0], 2.0) && close(s.values[1], 6.0));
    }

    #[test]
    fn needs_phase_one_for_equalities_and_lower_bounds() {
        // min x + y s.t. x + y ≥ 3, x − y = 1, x ∈ [0.5, 10] → (2, 1), 3.
        let mut p = Problem::new(Sense::Minimize);
        let x = p.add_var(0.5, 10.0, false, 1.0);
        let y = p.add_var(0.0, 10.0, false, 1.0);
        p.add_constraint(vec![(x, 1.0), (y, 1.0)], Relation::Ge, 3.0);
        p.add_constraint(vec![(x, 1.0), (y, -1.0)], Relation::Eq, 1.0);
        let s = solve(&p, &Budget::default(), None);
        assert_eq!(s.status, Status::Optimal);
        assert!(close(s.objective, 3.0), "{s:?}");
        assert!(p.is_feasible(&s.values, 1e-6));
    }

    #[test]
    fn reports_infeasible_and_unbounded() {
        let mut p = Problem::new(Sense::Minimize);
        let x = p.add_var(0.0, 1.0, true, 1.0);
        p.add_constraint(vec![(x, 1.0)], Relation::Ge, 2.0);
        assert_eq!(solve(&p, &Budget::default(), None).status, Status::Infeasible);
        // Integer-infeasible with a feasible relaxation: 2x = 1.
        let mut p = Problem::new(Sense::Minimize);
        let x = p.add_var(0.0, 5.0, true, 1.0);
        p.add_constraint(vec![(x, 2.0)], Relation::Eq, 1.0);
        assert_eq!(solve(&p, &Budget::default(), None).status, Status::Infeasible);
        let mut p = Problem::new(Sense::Maximize);
        let x = p.add_var(0.0, f64::INFINITY, false, 1.0);
        let y = p.add_var(0.0, f64::INFINITY, false, 0.0);
        p.add_constraint(vec![(x, 1.0), (y, -1.0)], Relation::Le, 1.0);
        assert_eq!(solve(&p, &Budget::default(), None).status, Status::Unbounded);
    }

    #[test]
    fn knapsack_needs_branching() {
        // max 10a + 13b + 7c s.t. 4a + 6b + 3c ≤ 10, binary → a + b (23)? 4+6=10 → 23;
        // a + c = 17, b + c = 20: the optimum is 23.
        let mut p = Problem::new(Sense::Maximize);
        let a = p.add_var(0.0, 1.0, true, 10.0);
        let b = p.add_var(0.0, 1.0, true, 13.0);
        let c = p.add_var(0.0, 1.0, true, 7.0);
        p.add_constraint(vec![(a, 4.0), (b, 6.0), (c, 3.0)], Relation::Le, 10.0);
        let relaxed = solve_relaxation(&p, 100);
        assert!(relaxed.objective > 23.0 + 1e-6, "the relaxation is fractional: {relaxed:?}");
        let s = solve(&p, &Budget::default(), None);
        assert_eq!(s.status, Status::Optimal);
        assert!(close(s.objective, 23.0), "{s:?}");
        assert!(s.nodes > 1);
    }

    #[test]
    fn warm_start_is_kept_when_the_budget_runs_out() {
        let (p, _) = random_problem(&mut XorShift::new(7), 8, 6);
        let exact = enumerate(&p);
        let Some((point, value)) = exact else { return };
        let s = solve(&p, &Budget { max_nodes: 0, ..Budget::default() }, Some(&point));
        assert_eq!(s.status, Status::Feasible);
        assert!(close(s.objective, value));
        // An infeasible warm start is ignored.
        let bad = vec![-1.0; p.var_count()];
        let s = solve(&p, &Budget { max_nodes: 0, ..Budget::default() }, Some(&bad));
        assert_eq!(s.status, Status::NoSolution);
    }

    #[test]
    fn deadline_from_a_caller_clock_stops_the_search() {
        let (p, _) = random_problem(&mut XorShift::new(11), 10, 8);
        let ticks = std::cell::Cell::new(0u64);
        let clock = || {
            ticks.set(ticks.get() + 1);
            ticks.get()
        };
        let s = solve(&p, &Budget { deadline: Some((3, &clock)), ..Budget::default() }, None);
        assert!(s.nodes <= 3, "{s:?}");
        assert!(matches!(s.status, Status::Feasible | Status::NoSolution | Status::Optimal | Status::Infeasible));
    }

    #[test]
    fn a_search_run_in_small_slices_ends_where_one_run_does() {
        let mut rng = XorShift::new(99);
        for _ in 0..40 {
            let (p, _) = random_problem(&mut rng, 5, 3);
            let whole = solve(&p, &Budget::default(), None);
            let mut search = Search::new(p.clone(), None);
            let sliced = Budget { slice_work: 40, ..Budget::default() };
            let mut calls = 0;
            let result = loop {
                calls += 1;
                if let Some(solution) = search.run(&sliced) {
                    break solution;
                }
                assert!(calls < 1_000_000);
            };
            assert_eq!(result.status, whole.status);
            if whole.has_point() {
                assert!(close(result.objective, whole.objective), "{} vs {}", result.objective, whole.objective);
            }
            assert!(calls > 1 || whole.pivots == 0, "small slices pause the search");
        }
    }

    /// A random bounded mixed-integer program: `ints` small integer variables (0..=3),
    /// `conts` continuous ones in [0, 2], random `≤`/`≥`/`=` rows.
    fn random_problem(rng: &mut XorShift, ints: usize, conts: usize) -> (Problem, usize) {
        let sense = if rng.below(2) == 0 { Sense::Maximize } else { Sense::Minimize };
        let mut p = Problem::new(sense);
        let coef = |rng: &mut XorShift| (rng.below(11) as f64 - 5.0) / 2.0;
        for _ in 0..ints {
            let c = coef(rng);
            p.add_var(0.0, 3.0, true, c);
        }
        for _ in 0..conts {
            let c = coef(rng);
            p.add_var(0.0, 2.0, false, c);
        }
        let rows = 2 + rng.below(5) as usize;
        for _ in 0..rows {
            let mut terms = Vec::new();
            for v in 0..ints + conts {
                if rng.below(3) > 0 {
                    let a = coef(rng);
                    if a != 0.0 {
                        terms.push((v, a));
                    }
                }
            }
            let relation = match rng.below(6) {
                0 => Relation::Eq,
                1 | 2 => Relation::Ge,
                _ => Relation::Le,
            };
            let rhs = rng.below(13) as f64 - 4.0;
            // Keep equalities satisfiable by integers where possible: use one integer term.
            if relation == Relation::Eq {
                let v = rng.below(ints as u64) as usize;
                terms = vec![(v, 1.0), (ints + rng.below(conts as u64) as usize, 1.0)];
            }
            p.add_constraint(terms, relation, rhs);
        }
        (p, ints)
    }

    /// The exact oracle: every integer assignment, each with its LP over the
    /// continuous variables.
    fn enumerate(p: &Problem) -> Option<(Vec<f64>, f64)> {
        let ints: Vec<Var> = (0..p.var_count()).filter(|&j| p.is_integer(j)).collect();
        let mut best: Option<(Vec<f64>, f64)> = None;
        let mut assignment = vec![0i64; ints.len()];
        loop {
            let mut fixed = p.clone();
            for (slot, &j) in ints.iter().enumerate() {
                fixed.lower[j] = assignment[slot] as f64;
                fixed.upper[j] = assignment[slot] as f64;
            }
            let s = solve_relaxation(&fixed, 100_000);
            if s.status == Status::Optimal && best.as_ref().is_none_or(|(_, b)| p.better(s.objective, *b)) {
                best = Some((s.values, s.objective));
            }
            // Next assignment (odometer).
            let mut slot = 0;
            loop {
                if slot == ints.len() {
                    return best;
                }
                let (_, hi) = p.bounds(ints[slot]);
                if (assignment[slot] as f64) < hi {
                    assignment[slot] += 1;
                    break;
                }
                assignment[slot] = 0;
                slot += 1;
            }
        }
    }

    #[test]
    fn agrees_with_exhaustive_enumeration_on_random_instances() {
        let mut rng = XorShift::new(2024);
        let mut feasible = 0;
        for case in 0..120 {
            let ints = 1 + rng.below(5) as usize;
            let conts = 1 + rng.below(3) as usize;
            let (p, _) = random_problem(&mut rng, ints, conts);
            let oracle = enumerate(&p);
            let s = solve(&p, &Budget::default(), None);
            match oracle {
                None => assert_eq!(s.status, Status::Infeasible, "case {case}: {p:?} {s:?}"),
                Some((_, value)) => {
                    feasible += 1;
                    assert_eq!(s.status, Status::Optimal, "case {case}: {p:?}");
                    assert!(close(s.objective, value), "case {case}: solver {} vs oracle {value}\n{p:?}", s.objective);
                    assert!(p.is_feasible(&s.values, 1e-6), "case {case}");
                }
            }
        }
        assert!(feasible > 30, "the generator must produce feasible cases too ({feasible})");
    }
}
