"""tracegrad.autograd_compat's ``scipy.signal`` (convolve), ``scipy.integrate``
(odeint), ``scipy.linalg``, ``scipy.misc`` and ``builtins``: against HIPS
autograd's own numbers and against finite differences.

AUTOGRAD below holds what autograd 1.9 computed for the very same functions
and inputs (the program is CASES with ``autograd``, ``autograd.numpy``,
``autograd.scipy.*`` and ``autograd.builtins`` imported in place of the
compat modules; autograd 1.9 has no ``scipy.misc``, so its ``logsumexp`` there
is ``autograd.scipy.special.logsumexp``).  Each entry: (value, gradient in each
argnum); for the convnet cases, (value, sum(g_x * cos(i)), sum(g_w * sin(i))).
The inputs come from ``np.random.RandomState(0)``, so the test runs without
autograd.
"""
import numpy as onp
import pytest
import scipy.integrate
import scipy.linalg

import tracegrad.autograd_compat as ag
import tracegrad.autograd_compat.numpy as np
import tracegrad.autograd_compat.scipy.linalg as sl
from tracegrad.autograd_compat.builtins import dict, isinstance, list, tuple, type
from tracegrad.autograd_compat.scipy.integrate import odeint
from tracegrad.autograd_compat.scipy.misc import logsumexp
from tracegrad.autograd_compat.scipy.signal import convolve

AUTOGRAD = {'banded': (1.0543493015289878,
                [[0.0, 0.034820758726487704, 0.1551109949720337, -0.1994150221592251,
                  -0.2624492669787479],
                 [-0.019476540371599155, 0.10445359589087504, 0.22578334826351823,
                  -0.3781754226141872, -0.2801946897256667],
                 [-0.05842476590780871, 0.15204520235756577, 0.4281809475748775,
                  -0.40374563214091774, 0.0]],
                [0.1288542042977839, 0.3865304914887644, 0.5626432129457464, 1.0670100603898685,
                 1.1391556023256622]),
     'containers': (0.33724512516962596, [1.231180284105747, 0.973482454278049, 0.6999776805260791],
                    [-1.505125367080488, 0.5693030974940657, 1.9502887746328335]),
     'conv1_full': (-1.168809946326041,
                    [0.4691763487849502, -0.4845294829910084, 1.1257292735584326,
                     -0.716592592498959, -0.6953252104398882],
                    [4.803355103038305, 4.137949456327959, 2.6824959991344275]),
     'conv1_same': (-1.73728764040475,
                    [0.09088047617478542, 1.1244668651116925, -1.7024339724767827,
                     0.6272121770117131, -1.1174206090956977],
                    [1.7207684571460096, 0.09216726672077669, 0.946012053497123]),
     'conv1_valid': (1.4244393941378761,
                     [0.3864134113371, -2.524495939982061, 2.98513728176078, 0.1825238250265102,
                      -0.8447943757098414],
                     [0.5803660897569207, 1.5552332679490322, -3.3960009387055607]),
     'conv2_full': (14.37338965278039,
                    [[-1.1011784849308146, -0.5447016556007171, 1.2456099321539689,
                      1.2155220711100712],
                     [3.273450377632307, -0.35632494828155703, 4.021305294740177,
                      1.338353687107272],
                     [-0.8997673917559976, -0.7838193621252099, -2.988386655566025,
                      -1.3869595306225457],
                     [4.3074492210804305, -1.7469125862898958, 0.788341852850023,
                      2.001107905789339],
                     [-4.744022793421264, 2.92391359500403, 1.0743093452650134,
                      -5.446915906703878]],
                    [[2.996725245539885, 6.277347554239186, 2.248374867777952],
                     [-4.753191398683832, -2.865297048268513, -5.567041067451504]]),
     'conv2_same': (5.850266424112871,
                    [[-0.012124637028366525, -0.4308730634774469, 3.979705398195046,
                      -1.1748232582998526],
                     [-0.1765936930579402, -0.35983760714398905, -1.4148156865756223,
                      1.4015400465431074],
                     [0.5298127562454817, -1.3733781653248778, -2.5551804309395605,
                      2.333535289197453],
                     [0.03679361246530666, 2.3792191879854627, 3.456397946359126,
                      -2.302108733674033],
                     [1.243455174405935, -2.406337549726885, -2.4585708059535456,
                      2.4889601493737006]],
                    [[5.732368147890949, 3.6980170195533413, 5.828081749383074],
                     [-0.3721942261146234, -3.105358289075273, -0.6528553788580937]]),
     'conv2_valid': (18.309705613893932,
                     [[-3.136806047987427, 2.1786855099901774, -2.756544371605898,
                       0.5181799399243912],
                      [0.3548652178310535, -4.493945836466207, 6.4338470026063215,
                       -3.2159305790865944],
                      [-2.061958890665896, -2.3244129242908906, -2.840921034899126,
                       1.4115587914730203],
                      [-2.1108390070646905, 0.5216940822568059, 0.13166312046556383,
                       4.722127611337163],
                      [-0.3969148809025354, -0.0844867963445271, 2.206415175713508,
                       -1.6800578761463563]],
                     [[4.842998125163612, 3.565909349950438, 0.17063730711589464],
                      [-5.805346172716292, 1.7584487197874932, -1.309960023258113]]),
     'convnet_full': (37.31475171871823, 65.90407484534224, 31.555989767325553),
     'convnet_same': (42.72558975112458, 20.189504574807362, 19.295003240009564),
     'convnet_valid': (-14.679117229923978, -9.656927316645058, -1.6039341426387388),
     'logsumexp': (13.452182679970765,
                   [[0.11186410197763433, 0.10374039427438612, 0.8348522262584877,
                     0.145230529120484],
                    [1.0477084098651193, 0.530951158297029, 0.49019694765659805,
                     0.4296221834828421],
                    [0.7485863775313378, 1.491066515639907, 0.3925466420871789,
                     0.6736345138089955]]),
     'odeint': (93.21298943200782, [174.2260814455078, -46.25422068751427],
                [-167.0670284232831, 9.060377150126094, 34.06252793185845, 121.61093441510027],
                [182.9441274457364, -78.68632236715797, -15.646601355291825], 11.280716040336547),
     'sqrtm': (-1.7597300877083044,
               [[0.2559494839340641, -0.0394053057769504, -0.08282286432378394],
                [-0.4479736793126184, -0.19875572929916066, 0.040101677357037756],
                [0.1725287249862536, 0.10491155137055408, -0.03538428547895025]]),
     'sylvester': (0.238346941764189,
                   [[0.036322612619862464, 0.03621910970307356, -0.010751915160929281],
                    [-0.03466748854502084, -0.04993890921423569, -0.0021735814833026956],
                    [-0.0008710206419635497, 0.0055223492714325745, 0.005428502547539541]],
                   [[-0.026771309814920714, -0.044189551343117424],
                    [-0.0029884664109258267, 0.01858351576808703]],
                   [[-0.15381594607818008, 0.23890696496960873],
                    [0.23806654137172198, 0.03632547224532274],
                    [-0.03425694370304586, -0.1156433596780304]]),
     'trsm_lower_t0': (-0.16656253378091224,
                       [[-0.004626704106213378, 0.0, 0.0],
                        [-0.17219716501162763, 0.048511228891803676, 0.0],
                        [-0.39550225031897307, 0.0468638948875421, 0.08983560221562853]],
                       [[0.14846776686218355, 0.026639512927234658],
                        [0.5212395443195819, 0.4418823959989775],
                        [0.1634793265439109, 0.9013934659217133]]),
     'trsm_lower_t1': (-0.5867522981556681,
                       [[-0.04081713826128201, 0.0, 0.0],
                        [0.08489503732147825, 0.1956903368368109, 0.0],
                        [0.15302010705965577, 0.35933316980269014, 0.31945841028643285]],
                       [[0.19464737646436117, 0.08765599599963687],
                        [0.4308432652193703, 0.011484169067957937],
                        [0.5041113134432478, 0.9069462767999248]]),
     'trsv_upper_t0': (-0.24330639438527668,
                       [[-0.1074495463220025, 0.047280577309524764, 0.034023161656993366],
                        [0.0, 0.07872897359148445, 0.056653466349545316],
                        [0.0, 0.0, 0.19669609614508085]],
                       [0.366538222282841, 0.6103389523664321, 2.1190457882144953]),
     'trsv_upper_t1': (-0.49771915414124257,
                       [[-0.058128007181324735, -0.3945128320965192, -0.4596645000307483],
                        [0.0, 0.14731468054949073, 0.1716429060675122],
                        [0.0, 0.0, 0.3109431549955564]],
                       [0.20743886241353762, 1.4078805908890244, 1.6403844824892015])}


def lv(y, t, a, b):
    return np.array([a[0] * y[0] - a[1] * y[0] * y[1],
                     -b * y[1] + a[2] * y[0] * y[1] + 0.1 * np.sin(t)])


def ode_loss(y0, t, a, b):
    Y = odeint(lv, y0, t, tuple((a, b)), rtol=1e-10, atol=1e-10)
    return np.sum(Y ** 2 * np.arange(1.0, 1.0 + Y.size).reshape(Y.shape))


def containers(p):
    t = tuple((p["w"] * 2.0, p["b"]))
    l = list([t[0], t[1] ** 2])   # noqa: E741
    d = dict(a=l[0], c=l[1])
    assert isinstance(t, tuple) and isinstance(l, list) and isinstance(d, dict)
    return np.sum(d["a"] * d["c"]) + np.sum(np.sin(p["w"]))


def _cases():
    """name -> (f, args, argnums); the draws in autograd's order."""
    rs = onp.random.RandomState(0)
    cases = {}
    A1, B1 = rs.randn(5), rs.randn(3)
    for mode, n in [("full", 7), ("same", 5), ("valid", 3)]:
        W = rs.randn(n)
        cases["conv1_" + mode] = (
            lambda a, b, W=W, mode=mode: np.sum(convolve(a, b, mode=mode) * W), (A1, B1), (0, 1))
    A2, B2 = rs.randn(5, 4), rs.randn(2, 3)
    for mode, s in [("full", (6, 6)), ("same", (5, 4)), ("valid", (4, 2))]:
        W = rs.randn(*s)
        cases["conv2_" + mode] = (
            lambda a, b, W=W, mode=mode: np.sum(convolve(a, b, mode=mode) * W), (A2, B2), (0, 1))
    X, F = rs.randn(2, 3, 5, 6), rs.randn(3, 4, 2, 3)
    for mode, s in [("full", (2, 4, 6, 8)), ("same", (2, 4, 5, 6)), ("valid", (2, 4, 4, 4))]:
        W = rs.randn(*s)

        def fconv(x, w, W=W, mode=mode):
            return np.sum(convolve(x, w, axes=([2, 3], [2, 3]), dot_axes=([1], [0]),
                                   mode=mode) * W)
        cases["convnet_" + mode] = (fconv, (X, F), (0, 1))
    cases["odeint"] = (ode_loss, (onp.array([1.0, 0.5]), onp.array([0.0, 0.3, 0.7, 1.2]),
                                  onp.array([1.1, 0.4, 0.3]), 0.8), (0, 1, 2, 3))
    M = rs.randn(3, 3)
    S = M @ M.T + 3 * onp.eye(3)
    W3 = rs.randn(3, 3)
    cases["sqrtm"] = (lambda a: np.sum(sl.sqrtm(a) * W3), (S,), (0,))
    U = onp.triu(rs.randn(3, 3)) + 3 * onp.eye(3)
    L = U.T.copy()
    bv, bm, Wm = rs.randn(3), rs.randn(3, 2), rs.randn(3, 2)
    for trans in (0, 1):
        cases[f"trsv_upper_t{trans}"] = (
            lambda a, b, trans=trans: np.sum(sl.solve_triangular(a, b, trans=trans)
                                             * np.arange(1.0, 4.0)), (U, bv), (0, 1))
        cases[f"trsm_lower_t{trans}"] = (
            lambda a, b, trans=trans: np.sum(sl.solve_triangular(a, b, trans=trans, lower=True)
                                             * Wm), (L, bm), (0, 1))
    Ay, By = rs.randn(3, 3) + 4 * onp.eye(3), rs.randn(2, 2) + 3 * onp.eye(2)
    Qy, Wy = rs.randn(3, 2), rs.randn(3, 2)
    cases["sylvester"] = (lambda a, b, q: np.sum(sl.solve_sylvester(a, b, q) * Wy),
                          (Ay, By, Qy), (0, 1, 2))
    ab = rs.randn(3, 5)
    ab[1] += 4.0
    bb = rs.randn(5)
    cases["banded"] = (lambda ab, b: np.sum(sl.solve_banded((1, 1), ab, b)
                                            * np.arange(1.0, 6.0)), (ab, bb), (0, 1))
    Xl = rs.randn(3, 4)
    cases["logsumexp"] = (lambda x: logsumexp(x) + np.sum(logsumexp(x, axis=1)
                                                          * np.arange(1.0, 4.0)), (Xl,), (0,))
    cases["containers"] = (containers, ({"w": rs.randn(3), "b": rs.randn(3)},), None)
    return cases


CASES = _cases()


def _gradients(f, args, argnums):
    if argnums is None:
        g = ag.grad(f)(*args)
        return (g["w"], g["b"])
    return ag.grad(f, argnums)(*args)


@pytest.mark.parametrize("name", sorted(AUTOGRAD))
def test_against_autograd(name):
    f, args, argnums = CASES[name]
    expected = AUTOGRAD[name]
    grads = _gradients(f, args, argnums)
    rtol = 1e-7 if name == "odeint" else 1e-10     # odeint: both within the solver's 1e-10
    assert float(f(*args)) == pytest.approx(expected[0], rel=1e-12)
    if name.startswith("convnet"):
        gx, gw = (onp.asarray(g) for g in grads)
        P = onp.cos(onp.arange(gx.size)).reshape(gx.shape)
        Q = onp.sin(onp.arange(gw.size)).reshape(gw.shape)
        got = [onp.sum(gx * P), onp.sum(gw * Q)]
    else:
        got = [onp.asarray(g) for g in grads]
    assert len(got) == len(expected) - 1
    for g, e in zip(got, expected[1:]):
        onp.testing.assert_allclose(g, onp.asarray(e), rtol=rtol, atol=rtol)


def _central(f, args, i, eps=1e-6):
    x = onp.asarray(args[i], float)
    out = onp.zeros(x.shape)
    for k in onp.ndindex(*x.shape):
        hi, lo = x.copy(), x.copy()
        hi[k] += eps
        lo[k] -= eps
        a_hi, a_lo = list(args), list(args)
        a_hi[i] = hi if x.shape else float(hi)
        a_lo[i] = lo if x.shape else float(lo)
        out[k] = (float(f(*a_hi)) - float(f(*a_lo))) / (2 * eps)
    return out


@pytest.mark.parametrize("name", [n for n in sorted(AUTOGRAD)
                                  if not n.startswith("convnet") and n != "containers"])
def test_finite_differences(name):
    f, args, argnums = CASES[name]
    grads = _gradients(f, args, argnums)
    for i, g in zip(argnums, grads):
        onp.testing.assert_allclose(onp.asarray(g), _central(f, args, i), rtol=1e-5, atol=1e-6)


def test_convolve_default_axes_is_scipy_and_stays_compiled():
    rs = onp.random.RandomState(1)
    a, b = rs.randn(6, 5), rs.randn(3, 2)
    for mode in ("full", "same", "valid"):
        onp.testing.assert_allclose(convolve(a, b, mode=mode),
                                    scipy.signal.convolve(a, b, mode=mode), atol=1e-12)
        onp.testing.assert_allclose(convolve(b, a, mode=mode),
                                    scipy.signal.convolve(b, a, mode=mode), atol=1e-12)
    op = ag.grad(lambda x, w: np.sum(np.tanh(convolve(x, w, axes=([1], [0]), dot_axes=([0], [1]),
                                                      mode="valid"))), (0, 1), mode="compiled")
    x, w = rs.randn(3, 7), rs.randn(3, 3)
    gx, gw = op(x, w)
    assert op.went_eager is None
    f = lambda x, w: onp.sum(onp.tanh(onp.stack(  # noqa: E731
        [onp.convolve(x[c], w[::-1, c][::-1], "valid") for c in range(3)]).sum(0)))
    onp.testing.assert_allclose(gx, _central(f, (x, w), 0), rtol=1e-6, atol=1e-8)
    onp.testing.assert_allclose(gw, _central(f, (x, w), 1), rtol=1e-6, atol=1e-8)


def test_convolve_second_order_and_errors():
    from tracegrad.autograd_compat.test_util import check_grads
    rs = onp.random.RandomState(2)
    x, w = rs.randn(2, 6), rs.randn(2, 3)

    def f(x, w):
        return np.sum(np.sin(convolve(x, w, axes=([1], [1]), dot_axes=([0], [0]))))
    check_grads(f, argnum=(0, 1), modes=["fwd", "rev"], order=2)(x, w)
    with pytest.raises(ValueError, match="Mode"):
        convolve(x, w, mode="circular")
    with pytest.raises(ValueError, match="large"):
        convolve(rs.randn(5, 3), rs.randn(2, 4), mode="valid")


def test_odeint_plain_is_scipy_and_runs_eagerly():
    y0, t = onp.array([1.0, 0.5]), onp.linspace(0, 1, 5)
    args = (onp.array([1.1, 0.4, 0.3]), 0.8)
    onp.testing.assert_array_equal(odeint(lv, y0, t, args),
                                   scipy.integrate.odeint(lv, y0, t, args))
    op = ag.grad(ode_loss, 1)            # mode="auto": the trace asks for values, eager from then
    g = op(y0, t, *args)
    assert op.went_eager is not None
    onp.testing.assert_allclose(g, _central(ode_loss, (y0, t) + args, 1), rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match="odeint"):
        ag.grad(ode_loss, 1, mode="compiled")(y0, t, *args)


def test_odeint_tfirst_and_closure_parameters():
    def loss(k, t):
        f = lambda t, y: -k * y + np.cos(t)   # noqa: E731
        return np.sum(odeint(f, np.array([1.0, 2.0]), t, tfirst=True, rtol=1e-10, atol=1e-10))
    k, t = onp.array([0.7, 1.3]), onp.array([0.1, 0.5, 1.0])
    gk, gt = ag.grad(loss, (0, 1))(k, t)
    onp.testing.assert_allclose(gk, _central(loss, (k, t), 0), rtol=1e-5, atol=1e-6)
    onp.testing.assert_allclose(gt, _central(loss, (k, t), 1), rtol=1e-5, atol=1e-6)


def test_odeint_second_derivative_is_refused():
    y0, t, a = onp.array([1.0, 0.5]), onp.array([0.0, 0.5]), onp.array([1.1, 0.4, 0.3])
    with pytest.raises(Exception, match="odeint"):
        ag.hessian(lambda y: ode_loss(y, t, a, 0.8))(y0)


def test_linalg_other_names_are_scipy_and_refuse_by_name():
    rs = onp.random.RandomState(3)
    a = rs.randn(4, 4)
    onp.testing.assert_array_equal(sl.eigvals(a), scipy.linalg.eigvals(a))
    assert sl.LinAlgError is scipy.linalg.LinAlgError
    with pytest.raises(NotImplementedError, match="eigvals"):
        ag.grad(lambda x: np.sum(np.real(sl.eigvals(x))))(a)
    ab = rs.randn(3, 6)
    ab[1] += 4.0
    b = rs.randn(6, 2)
    onp.testing.assert_array_equal(sl.solve_banded((1, 1), ab, b),
                                   scipy.linalg.solve_banded((1, 1), ab, b))
    for name in ("sqrtm", "solve_triangular", "solve_sylvester", "cholesky", "solve_banded"):
        assert name in sl.__all__


def test_cholesky_gradient():
    rs = onp.random.RandomState(4)
    m = rs.randn(3, 3)
    s = m @ m.T + 2 * onp.eye(3)
    w = rs.randn(3, 3)
    for lower in (False, True):
        f = lambda x, lower=lower: np.sum(sl.cholesky(x, lower=lower) * w)   # noqa: E731
        g = ag.grad(f)(s)
        # cholesky reads one triangle: compare on symmetric perturbations
        d = rs.randn(3, 3)
        d = d + d.T
        fd = (f(s + 1e-6 * d) - f(s - 1e-6 * d)) / 2e-6
        assert onp.sum(g * d) == pytest.approx(fd, rel=1e-6)


def test_builtins_see_through_differentiated_values():
    seen = []

    def f(x, p):
        seen.append((isinstance(x, onp.ndarray), type(x) is onp.ndarray,
                     isinstance(p, tuple), isinstance(x, (int, onp.ndarray)),
                     isinstance(x, float)))
        return np.sum(x * p[0])
    ag.grad(f, mode="eager")(onp.ones(3), tuple((onp.arange(3.0),)))
    ag.grad(f, mode="compiled")(onp.ones(3), tuple((onp.arange(3.0),)))
    assert seen and all(s == (True, True, True, True, False) for s in seen)
    assert tuple([1, 2]) == (1, 2) and list((1,)) == [1] and dict(a=1) == {"a": 1}
    assert type(3) is int and isinstance(3, int)
    from tracegrad.autograd_compat import dict as d2, isinstance as i2, tuple as t2
    assert t2 is tuple and d2 is dict and i2 is isinstance


# autograd's examples/ode_net.py pattern: a network's [(W, b), ...] through
# ``tuple((params,))``; AUTOGRAD_ODE_NET: autograd 1.9's loss and gradients.
AUTOGRAD_ODE_NET = (
    6.718074612524916,
    [[1.91807524220272, 0.06666130367791574, -3.5960324250607365, 1.2837543308880193,
      1.0701199273110713],
     [1.4566300065830458, 0.056134923635412934, -2.708151770535156, 0.9684295846149518,
      0.8340171249213091]],
    [2.1178059734334203, 0.07589569855205625, -3.9610475387476134, 1.4147412180986576,
     1.190456367353191],
    [[1.3895460611519095, 1.1629766390253033], [1.986942533732764, 1.731056998548726],
     [1.4454313303750936, 1.2364318055395136], [2.569769926671291, 2.2016391337078],
     [2.6808477152651, 2.309206126201569]],
    [4.748479781986895, 4.105476069211685])


def test_odeint_nested_parameters_as_autograds_ode_net():
    def nn_predict(inputs, t, params):
        for W, b in params:
            outputs = np.dot(inputs, W) + b
            inputs = np.tanh(outputs)
        return outputs

    def func(y, t, params):
        return nn_predict(np.reshape(y, (1, 2)), t, params).ravel()

    rs = onp.random.RandomState(0)
    params = [(0.3 * rs.randn(2, 5), 0.1 * rs.randn(5)), (0.3 * rs.randn(5, 2), 0.1 * rs.randn(2))]
    t, y0 = onp.linspace(0, 1, 5), onp.array([1.0, 0.5])

    def loss(params):
        return np.sum(odeint(func, y0, t, tuple((params,)), rtol=1e-9, atol=1e-9) ** 2)
    assert float(loss(params)) == pytest.approx(AUTOGRAD_ODE_NET[0], rel=1e-12)
    g = ag.grad(loss)(params)
    assert isinstance(g, list) and isinstance(g[0], tuple)
    got = [x for layer in g for x in layer]
    for x, e in zip(got, AUTOGRAD_ODE_NET[1:]):
        onp.testing.assert_allclose(x, onp.asarray(e), rtol=1e-7, atol=1e-8)


def test_odeint_value_in_args_and_closure_counts_once():
    t, y0 = onp.linspace(0, 1, 4), onp.array([1.0])

    def loss(k):                    # k twice in args and once in the closure: -2 k y
        def f(y, tt, a, b):
            return -a * y - k * y
        return np.sum(odeint(f, y0, t, (k, k), rtol=1e-10, atol=1e-10))

    def ref(k):
        return np.sum(odeint(lambda y, tt, a: -2 * a * y, y0, t, (k,), rtol=1e-10, atol=1e-10))
    k = onp.array(0.7)
    assert float(ag.grad(loss)(k)) == pytest.approx(float(ag.grad(ref)(k)), rel=1e-7)
    assert float(ag.grad(ref)(k)) == pytest.approx(float(_central(ref, (k,), 0)), rel=1e-6)


def test_a_value_reached_through_args_and_a_closure_counts_once():
    """SciPy as written (tracegrad/frontend/scipy_roots.py): k is in the
    right-hand side's closure and in args; its sensitivity is counted once."""
    import scipy.integrate
    import tracegrad as tg
    y0, t = onp.array([1.0]), onp.linspace(0, 1, 5)

    def f(k):
        return onp.sum(scipy.integrate.odeint(lambda y, t, a: -a * y - k * y, y0, t, args=(k,)))
    g = tg.grad(f, compile=False)(0.5)
    fd = (f(0.5 + 1e-6) - f(0.5 - 1e-6)) / 2e-6
    assert abs(g - fd) < 1e-5 * abs(fd)
