// mHC kernels against PyTorch: Hugging Face transformers' DeepseekV4HyperConnection and
// DeepseekV4HyperHead (torch 2.15.0 and transformers from the repo's .venv, fp32 as the modules
// run), and the post mixing of DeepseekV4DecoderLayer.forward (post * f + comb^T @ x).
// Inputs are closed-form (the same formulas below and in the script, evaluated in double and
// rounded to f32); upstream gradients dy, dpost, dcomb, dout likewise. Config A exercises large
// eps (hc_eps = 1e-2, rms_norm_eps = 0.1) so every + eps of the Sinkhorn denominators matters;
// config B is the model's (hc_mult 4, 20 iterations, eps 1e-6). Regenerate the constants with
// `.venv/bin/python gen_hc.py` on this script:
//   import math, textwrap, torch
//   from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
//   from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection, DeepseekV4HyperHead
//
//   def ten(shape, f):
//       n = math.prod(shape)
//       return torch.tensor([f(i) for i in range(n)], dtype=torch.float64).float().reshape(shape)
//
//   def arr(name, t):
//       v = t.detach().reshape(-1).tolist()
//       body = textwrap.fill(", ".join(f"{x:.9g}f" for x in v), 110, initial_indent="    ", subsequent_indent="    ")
//       print(f"const float {name}[{len(v)}] = {{\n{body}}};")
//
//   def run(tag, N, n, d, iters, hc_eps, norm_eps, with_dfn):
//       cfg = DeepseekV4Config(hidden_size=d, hc_mult=n, hc_sinkhorn_iters=iters, hc_eps=hc_eps, rms_norm_eps=norm_eps)
//       R, K = (2 + n) * n, n * d
//       hc = DeepseekV4HyperConnection(cfg)
//       head = DeepseekV4HyperHead(cfg)
//       with torch.no_grad():
//           hc.fn.copy_(ten((R, K), lambda i: 0.3 * math.cos(0.37 * i + 0.11)))
//           hc.base.copy_(ten((R,), lambda i: 0.2 * math.sin(1.3 * i + 0.5)))
//           hc.scale.copy_(torch.tensor([0.9, 1.1, 1.3]))
//           head.hc_fn.copy_(ten((n, K), lambda i: 0.25 * math.sin(0.41 * i + 0.9)))
//           head.hc_base.copy_(ten((n,), lambda i: 0.1 * math.cos(2.1 * i)))
//           head.hc_scale.copy_(torch.tensor([0.8]))
//       x = ten((1, N, n, d), lambda i: math.sin(0.7 * i + 0.3) * (1 + 0.1 * ((i // d) % n))).requires_grad_()
//       dy = ten((1, N, d), lambda i: math.cos(0.5 * i))
//       dpost = ten((1, N, n), lambda i: math.sin(0.9 * i + 0.2))
//       dcomb = ten((1, N, n, n), lambda i: math.cos(1.1 * i + 0.4))
//       post, comb, y = hc(x)
//       ((post * dpost).sum() + (comb * dcomb).sum() + (y * dy).sum()).backward()
//       arr(f"k{tag}Y", y); arr(f"k{tag}Post", post); arr(f"k{tag}Comb", comb); arr(f"k{tag}Dx", x.grad)
//       if with_dfn: arr(f"k{tag}Dfn", hc.fn.grad)
//       arr(f"k{tag}Dbase", hc.base.grad); arr(f"k{tag}Dscale", hc.scale.grad)
//       # post step, as DeepseekV4DecoderLayer.forward mixes: post * f + comb^T @ x
//       xp = x.detach().clone().requires_grad_()
//       pp = post.detach().clone().requires_grad_()
//       cp = comb.detach().clone().requires_grad_()
//       f = ten((1, N, d), lambda i: math.sin(0.23 * i - 0.4)).requires_grad_()
//       dout = ten((1, N, n, d), lambda i: math.cos(0.31 * i + 0.7))
//       out = pp.unsqueeze(-1) * f.unsqueeze(-2) + torch.matmul(cp.transpose(-1, -2), xp)
//       (out * dout).sum().backward()
//       arr(f"k{tag}Out", out); arr(f"k{tag}PostDx", xp.grad); arr(f"k{tag}Df", f.grad)
//       arr(f"k{tag}Dpost", pp.grad); arr(f"k{tag}Dcomb", cp.grad)
//       # head
//       xh = x.detach().clone().requires_grad_()
//       yh = head(xh)
//       (yh * dy).sum().backward()
//       arr(f"k{tag}HeadY", yh); arr(f"k{tag}HeadDx", xh.grad)
//       if with_dfn: arr(f"k{tag}HeadDfn", head.hc_fn.grad)
//       arr(f"k{tag}HeadDbase", head.hc_base.grad); arr(f"k{tag}HeadDscale", head.hc_scale.grad)
//
//   print("// torch", torch.__version__)
//   run("A", 2, 3, 5, 4, 1e-2, 0.1, True)
//   run("B", 2, 4, 6, 20, 1e-6, 1e-6, False)
#include <gtest/gtest.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>
#include "core/error.h"
#include "kernels/hyper_conn.h"
#include "kernels/ref/hyper_conn.h"

namespace {

using trex::kern::HcShape;

const float kAY[10] = {
    0.200340465f, 0.407520652f, 0.423037589f, 0.239593238f, -0.0565354973f, -0.486896336f, -0.297809035f,
    0.0313424915f, 0.345753133f, 0.497550786f};
const float kAPost[6] = {
    0.435922176f, 0.525050759f, 0.923836708f, 0.938578606f, 0.838036001f, 0.871752381f};
const float kAComb[18] = {
    0.264764577f, 0.428840488f, 0.296389937f, 0.558738947f, 0.309201896f, 0.1222561f, 0.166492477f,
    0.251957059f, 0.571358621f, 0.295170039f, 0.318818629f, 0.376011342f, 0.285945743f, 0.387872726f,
    0.31618163f, 0.408884168f, 0.283308685f, 0.297807068f};
const float kADx[30] = {
    0.209592372f, 0.324490815f, 0.290622383f, 0.130921602f, -0.083106935f, 0.854175091f, 0.858478665f,
    0.741636276f, 0.535721123f, 0.271940321f, 0.823818445f, 0.606326401f, 0.215835214f, -0.262849182f,
    -0.710231364f, 0.106133133f, -0.0968804359f, -0.231903583f, -0.278696388f, -0.242029577f, -0.832043409f,
    -1.09835339f, -1.13931274f, -0.960536718f, -0.613446653f, -0.820128441f, -0.773901939f, -0.564760506f,
    -0.215749964f, 0.21464783f};
const float kADfn[225] = {
    -0.278677702f, -0.0277562998f, 0.236219347f, 0.389097333f, 0.358976752f, 0.17602624f, -0.125609934f,
    -0.368169695f, -0.437573552f, -0.301179677f, -0.0252396464f, 0.289950967f, 0.468773156f, 0.427123934f,
    0.184591725f, 0.0284697805f, -0.3335706f, -0.538727522f, -0.49051249f, -0.211601749f, 0.183511451f,
    0.51347661f, 0.601945579f, 0.407310188f, 0.0211104639f, -0.409110337f, -0.648839295f, -0.583409071f,
    -0.243592337f, 0.210789591f, 0.227792844f, 0.612407088f, 0.708996654f, 0.472134113f, 0.0132194497f,
    -0.497103781f, -0.774953306f, -0.688330114f, -0.277974546f, 0.263116747f, 0.74232018f, 0.848479092f,
    0.555585086f, 0.00139068172f, -0.553457737f, -0.120474167f, -0.055386167f, 0.0357507989f, 0.110073619f,
    0.132627085f, 0.102084383f, 0.0102670565f, -0.0863789991f, -0.142399669f, -0.131447539f, -0.0640075579f,
    0.0454859622f, 0.133586735f, 0.158859566f, 0.10941828f, 0.503689528f, 0.715151966f, 0.590267301f,
    0.187770665f, -0.303037405f, -0.716454566f, -0.762608171f, -0.450095206f, 0.0741045326f, 0.563451707f,
    0.859416842f, 0.699961901f, 0.211303979f, -0.376733541f, -0.787587404f, 0.785114408f, 1.04861891f,
    0.818941653f, 0.204103276f, -0.506728053f, -1.07716107f, -1.09031546f, -0.5906775f, 0.186765254f,
    0.876369417f, 1.25869453f, 0.969366014f, 0.224129543f, -0.626518548f, -1.18250525f, 0.339871347f,
    0.467098296f, 0.374641627f, 0.105985112f, -0.212517813f, -0.47417739f, -0.491572112f, -0.277772754f,
    0.0666674078f, 0.379752845f, 0.560983181f, 0.443851382f, 0.117969349f, -0.263395518f, -0.520881355f,
    -0.047370594f, -0.101486422f, -0.107871599f, -0.0635230914f, 0.0107013322f, 0.087882027f, 0.122660294f,
    0.0997495055f, 0.029924972f, -0.0539737456f, -0.122713923f, -0.12883313f, -0.074360095f, 0.0150856506f,
    0.0974363834f, -0.292500764f, -0.365611881f, -0.266770005f, -0.0424620435f, 0.201816484f, 0.386295348f,
    0.368911803f, 0.178023264f, -0.0965923741f, -0.32577911f, -0.438269258f, -0.315018266f, -0.0436092652f,
    0.248309866f, 0.423445016f, -0.642474294f, -0.86171627f, -0.675679684f, -0.171860337f, 0.412787586f,
    0.883624613f, 0.897600412f, 0.489420623f, -0.148941219f, -0.717253685f, -1.03443336f, -0.799897909f,
    -0.189158008f, 0.51054585f, 0.970132053f, 0.15927124f, 0.236430883f, 0.202393398f, 0.0731671229f,
    -0.0904707834f, -0.232714772f, -0.256462276f, -0.159591556f, 0.0123375505f, 0.178464115f, 0.284352243f,
    0.240281045f, 0.0832019374f, -0.11300835f, -0.256069064f, 0.483203053f, 0.625285447f, 0.473286301f,
    0.0986932144f, -0.322316796f, -0.650909901f, -0.641138136f, -0.329829127f, 0.136603668f, 0.53878957f,
    0.750081122f, 0.559616923f, 0.105956122f, -0.39753747f, -0.714063048f, 0.303841621f, 0.395164222f,
    0.30063495f, 0.0647123381f, -0.201645464f, -0.410482943f, -0.40609929f, -0.210720792f, 0.0837629661f,
    0.33885166f, 0.474079818f, 0.355536103f, 0.069778204f, -0.248797461f, -0.450359821f, -0.109218165f,
    -0.127500772f, -0.0858177766f, -0.0037733363f, 0.0800457597f, 0.1388399f, 0.124330886f, 0.0513471141f,
    -0.0457860082f, -0.121385247f, -0.15261285f, -0.101029217f, -0.00192997069f, 0.0980769694f, 0.151956797f,
    -0.194623455f, -0.267663479f, -0.214817196f, -0.0609390214f, 0.121599711f, 0.271643043f, 0.281768441f,
    0.159373701f, -0.0379769467f, -0.217466444f, -0.321466982f, -0.254506916f, -0.0678482577f, 0.150720492f,
    0.298403054f};
const float kADbase[15] = {
    0.738586783f, -0.779955029f, 0.631262183f, 0.186901361f, 0.0471821129f, -0.0397271216f, 0.00452411175f,
    -0.0533799604f, 0.0488558337f, 0.0222724676f, 0.0275476053f, -0.0498200655f, -0.0284562707f, 0.031315133f,
    -0.00285886973f};
const float kADscale[3] = {
    -0.173380151f, -0.233123347f, -0.49451685f};
const float kAOut[30] = {
    -0.29765898f, -0.254096389f, -0.121829949f, 0.078652136f, 0.294203997f, -0.0287115276f, 0.238678843f,
    0.356715471f, 0.320132494f, 0.19569172f, 0.228631705f, 0.639980733f, 0.685059786f, 0.431080878f,
    0.0846894383f, 0.235105902f, 0.557579696f, 0.943366587f, 1.25223112f, 1.36079931f, 0.384690195f,
    0.577894747f, 0.789984226f, 0.958001494f, 1.02247047f, 0.258665472f, 0.498586327f, 0.806386709f,
    1.07557559f, 1.19988048f};
const float kAPostDx[30] = {
    -0.301318049f, -0.385454684f, -0.432844847f, -0.438970655f, -0.403248161f, 0.136414021f, -0.0304661766f,
    -0.194441959f, -0.339880973f, -0.452918261f, -0.482858509f, -0.445720643f, -0.366090953f, -0.251560777f,
    -0.113048568f, 0.224701822f, 0.135157615f, 0.0327284038f, -0.0728208125f, -0.171427876f, 0.309125453f,
    0.216215447f, 0.102692991f, -0.0206195116f, -0.141966254f, 0.307327002f, 0.267727524f, 0.202604741f,
    0.118167073f, 0.0224642456f};
const float kADf[10] = {
    -0.727136374f, -0.730334103f, -0.663907051f, -0.534187853f, -0.353542924f, 0.752961934f, 0.579175711f,
    0.350174785f, 0.0877907872f, -0.182962537f};
const float kADpost[6] = {
    -0.569173515f, -0.424544573f, 0.551516831f, 3.91031933f, 1.1043762f, -3.86438847f};
const float kADcomb[18] = {
    0.864706695f, -2.5581243f, -0.971098125f, -1.4271853f, 2.34631705f, 1.52476776f, 1.87834597f,
    -1.72419453f, -1.95005465f, -0.48910898f, -1.67775881f, 0.41933161f, -0.498503268f, 1.60633552f,
    0.565310299f, 1.60546207f, -1.2687192f, -1.65822756f};
const float kAHeadY[10] = {
    0.321769595f, 0.513568521f, 0.463828176f, 0.195942149f, -0.164098516f, -0.611005902f, -0.379855871f,
    0.0299463272f, 0.425664246f, 0.62118572f};
const float kAHeadDx[30] = {
    0.660623431f, 0.620473504f, 0.437056363f, 0.156337783f, -0.153516173f, 0.565053165f, 0.453054637f,
    0.230045184f, -0.0532257073f, -0.33058849f, 0.364807069f, 0.318833351f, 0.18627882f, 0.0020834133f,
    -0.185180277f, -0.483318418f, -0.602830887f, -0.573134899f, -0.401114702f, -0.128711104f, -0.501057029f,
    -0.62866962f, -0.602699816f, -0.431121975f, -0.157239661f, -0.521172047f, -0.632798672f, -0.59149158f,
    -0.405497223f, -0.1186039f};
const float kAHeadDfn[45] = {
    -0.21890597f, 0.023798218f, 0.255309761f, 0.366745114f, 0.305694491f, 0.110958137f, -0.166533083f,
    -0.365701139f, -0.392874271f, -0.235272452f, 0.0359799638f, 0.311698824f, 0.440820932f, 0.362617999f,
    0.113870203f, 0.026972644f, -0.299647152f, -0.485338181f, -0.442767173f, -0.191955745f, 0.164048955f,
    0.462094516f, 0.542809725f, 0.368233085f, 0.0204706527f, -0.367548466f, -0.584564686f, -0.526651144f,
    -0.221045226f, 0.188521653f, 0.216421708f, 0.585104167f, 0.678603053f, 0.452944309f, 0.014258761f,
    -0.474246204f, -0.741131663f, -0.659451246f, -0.267620683f, 0.250076085f, 0.709263444f, 0.812138915f,
    0.533052802f, 0.00326359435f, -0.528060555f};
const float kAHeadDbase[3] = {
    0.760128975f, -0.792711437f, 0.68241781f};
const float kAHeadDscale[1] = {
    0.0729281008f};
const float kBY[12] = {
    0.497894049f, 0.600921571f, 0.42132625f, 0.043574661f, -0.354670823f, -0.586109042f, -0.116259903f,
    -0.230994463f, -0.237088785f, -0.131676525f, 0.0356653035f, 0.186233103f};
const float kBPost[8] = {
    1.02095342f, 1.24789155f, 0.702780962f, 1.4411211f, 1.35341191f, 0.544896901f, 1.54989958f, 0.651455164f};
const float kBComb[32] = {
    0.106262922f, 0.387556851f, 0.29763779f, 0.208541512f, 0.496745557f, 0.0296903569f, 0.352890819f,
    0.120672308f, 0.201159447f, 0.213824973f, 0.0395167358f, 0.545497835f, 0.19583109f, 0.368926853f,
    0.30995369f, 0.125287384f, 0.188231319f, 0.226739943f, 0.0970140845f, 0.488013655f, 0.0949408412f,
    0.379575908f, 0.416145802f, 0.109336406f, 0.50917834f, 0.0225833226f, 0.42300728f, 0.045230031f,
    0.207648486f, 0.37109983f, 0.0638317168f, 0.357418984f};
const float kBDx[48] = {
    1.099141f, 0.978917301f, 0.680167854f, 0.270993143f, -0.165772706f, -0.548993766f, 0.206386298f,
    0.024412334f, -0.215534106f, -0.456027567f, -0.630339742f, -0.683418036f, 0.442451119f, 0.571000934f,
    0.557163596f, 0.411651105f, 0.180334866f, -0.0663438141f, 0.751716435f, 0.601332724f, 0.361411214f,
    0.0800904781f, -0.196819425f, -0.431853592f, -0.0921780765f, -0.195396304f, -0.222660065f, -0.190623611f,
    -0.13269195f, -0.0842099935f, -1.05511677f, -1.04728353f, -0.825680852f, -0.427500695f, 0.0669813752f,
    0.550021768f, -0.201301068f, -0.0292229056f, 0.1710774f, 0.356066525f, 0.487807482f, 0.540274858f,
    -0.315440476f, -0.430772722f, -0.425624043f, -0.327006161f, -0.185230985f, -0.0539280176f};
const float kBDbase[24] = {
    1.08225608f, -0.883674741f, -0.478710175f, 1.49829125f, -0.168427378f, 0.0218110681f, 0.19429633f,
    0.190840393f, 0.136119723f, 0.273465335f, -0.126904547f, -0.282680511f, -0.264292061f, -0.178124338f,
    0.399387062f, 0.043029286f, -0.14320071f, -0.156507105f, -0.104485974f, 0.404193789f, 0.271372467f,
    0.061165683f, -0.167995274f, -0.164542884f};
const float kBDscale[3] = {
    0.0417088568f, -0.1328049f, 0.0292927176f};
const float kBOut[48] = {
    -0.656913698f, -0.341341168f, 0.062630102f, 0.462714076f, 0.767106414f, 0.922585964f, -0.0761768818f,
    0.504558921f, 0.759818316f, 0.688975334f, 0.443129063f, 0.247836292f, -0.401784837f, 0.135981411f,
    0.560135841f, 0.738449991f, 0.653391004f, 0.406873852f, -0.142012686f, -0.0294472724f, -0.00486005843f,
    0.0581041873f, 0.265850574f, 0.647626519f, 0.957626939f, 1.40784729f, 1.72479236f, 1.7909627f, 1.5772866f,
    1.1566844f, 0.0279263258f, -0.0768247843f, 0.0674790442f, 0.405677915f, 0.779536545f, 1.00212145f,
    1.58365846f, 1.73600173f, 1.67751265f, 1.47184718f, 1.21807957f, 1.00398242f, -0.302814126f,
    -0.162153363f, 0.309332252f, 0.905089378f, 1.34591031f, 1.41119719f};
const float kBPostDx[48] = {
    -0.119814619f, -0.11278972f, -0.095012188f, -0.0681768507f, -0.034842059f, 0.0018143421f, 0.37407726f,
    0.356848776f, 0.305600941f, 0.22521928f, 0.12336681f, 0.00975339115f, 0.509290278f, 0.421720803f,
    0.293947607f, 0.138151497f, -0.0308149755f, -0.196843788f, -0.122545764f, -0.126354083f, -0.118116736f,
    -0.0986189246f, -0.0697195455f, -0.0341736116f, 0.0281727016f, -0.107525766f, -0.232973427f,
    -0.336211115f, -0.407396823f, -0.439744204f, 0.0155941546f, 0.101964697f, 0.178614676f, 0.238236845f,
    0.27514714f, 0.285826921f, 0.177511305f, 0.0949225649f, 0.00328466855f, -0.088666454f, -0.172164693f,
    -0.239249989f, -0.176589698f, -0.25440073f, -0.30795902f, -0.332158685f, -0.324692696f, -0.286272824f};
const float kBDf[12] = {
    0.976687968f, 0.727052569f, 0.408105314f, 0.0502522588f, -0.312391728f, -0.645254314f, 0.603943229f,
    0.394690007f, 0.147809789f, -0.113161594f, -0.363344848f, -0.57888937f};
const float kBDpost[8] = {
    -0.997361004f, -0.619557977f, 1.35074353f, -0.150876448f, -4.23635578f, -1.04281235f, 4.83115292f,
    -1.71277165f};
const float kBDcomb[32] = {
    1.24905968f, -2.36957598f, 0.102494657f, 2.31111503f, -2.48285413f, 0.566952825f, 2.15947652f,
    -1.79867089f, 1.15693796f, 2.23704433f, -2.432899f, -0.84937191f, 1.70534587f, -3.04629493f,
    0.0321941376f, 3.02793193f, -1.10421777f, 2.20582151f, -0.153934658f, -2.11802053f, 2.67958522f,
    -0.666112661f, -2.299649f, 1.97778225f, -1.54118371f, -1.93447173f, 2.64456391f, 0.426070303f,
    -1.52968812f, 2.84208155f, -0.091372788f, -2.7899642f};
const float kBHeadY[12] = {
    0.321247399f, 0.658114672f, 0.685460329f, 0.390423238f, -0.0882359669f, -0.525396466f, -0.587702513f,
    -0.634616971f, -0.3830612f, 0.0486542284f, 0.457486868f, 0.651156187f};
const float kBHeadDx[48] = {
    0.79692477f, 0.783723116f, 0.605111599f, 0.306978911f, -0.0415149331f, -0.363838375f, 0.42846781f,
    0.252082944f, -0.00244596601f, -0.277912915f, -0.507898867f, -0.633810878f, 0.329103887f, 0.399323583f,
    0.368181258f, 0.250075877f, 0.0811130106f, -0.0903905332f, 0.813823581f, 0.672404408f, 0.389153004f,
    0.0260100868f, -0.339685023f, -0.631662488f, -0.568558693f, -0.433842599f, -0.200467914f, 0.0858120173f,
    0.365953147f, 0.579652548f, -0.320534557f, -0.335688531f, -0.249749392f, -0.093407765f, 0.0844936296f,
    0.230989173f, -0.657676458f, -0.671367168f, -0.542005539f, -0.298928499f, 0.00281497836f, 0.295571774f,
    -0.443567455f, -0.3161093f, -0.0955761075f, 0.170600742f, 0.420476913f, 0.591456354f};
const float kBHeadDbase[4] = {
    1.20440483f, -0.957921267f, -0.403408259f, 1.58468831f};
const float kBHeadDscale[1] = {
    0.619168639f};

// The closed-form inputs of the script, f(i) over the flat index, evaluated in double.
std::vector<float> ten(size_t n, const std::function<double(size_t)>& f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(f(i));
  return v;
}

struct Inputs {
  HcShape s;
  std::vector<float> x, fn, base, scale, dy, dpost, dcomb, f, dout, hfn, hbase, hscale;
};

Inputs make_inputs(int64_t N, int n, int64_t d, int iters, float hc_eps, float norm_eps) {
  Inputs in{{N, n, d, iters, hc_eps, norm_eps}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  const size_t R = (2 + n) * n, K = n * d;
  in.x = ten(N * K, [&](size_t i) { return std::sin(0.7 * i + 0.3) * (1 + 0.1 * ((i / d) % n)); });
  in.fn = ten(R * K, [](size_t i) { return 0.3 * std::cos(0.37 * i + 0.11); });
  in.base = ten(R, [](size_t i) { return 0.2 * std::sin(1.3 * i + 0.5); });
  in.scale = {0.9f, 1.1f, 1.3f};
  in.dy = ten(N * d, [](size_t i) { return std::cos(0.5 * i); });
  in.dpost = ten(N * n, [](size_t i) { return std::sin(0.9 * i + 0.2); });
  in.dcomb = ten(N * n * n, [](size_t i) { return std::cos(1.1 * i + 0.4); });
  in.f = ten(N * d, [](size_t i) { return std::sin(0.23 * i - 0.4); });
  in.dout = ten(N * K, [](size_t i) { return std::cos(0.31 * i + 0.7); });
  in.hfn = ten(n * K, [](size_t i) { return 0.25 * std::sin(0.41 * i + 0.9); });
  in.hbase = ten(n, [](size_t i) { return 0.1 * std::cos(2.1 * i); });
  in.hscale = {0.8f};
  return in;
}

// Every output and gradient of the three steps, as f32.
struct Results {
  std::vector<float> y, post, comb, dx, dfn, dbase, dscale;      // pre step
  std::vector<float> out, pdx, df, dpost, dcomb;                 // post step
  std::vector<float> hy, hdx, hdfn, hdbase, hdscale;             // head
};

template <class T>
std::vector<T> cast(const std::vector<float>& v) {
  return std::vector<T>(v.begin(), v.end());
}
template <class T>
std::vector<float> to_f32(const std::vector<T>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// The dispatched kernels (float).
Results run_kernels(const Inputs& in) {
  const HcShape& s = in.s;
  const size_t N = s.N, n = s.n, d = s.d, R = (2 + n) * n, K = n * d;
  Results r;
  r.y.resize(N * d), r.post.resize(N * n), r.comb.resize(N * n * n);
  std::vector<float> mix(N * R), rstd(N), ws(trex::kern::hc_pre_bwd_workspace_floats(s));
  trex::kern::hc_pre_fwd(s, in.x.data(), in.fn.data(), in.base.data(), in.scale.data(), r.y.data(), r.post.data(),
                         r.comb.data(), mix.data(), rstd.data());
  r.dx.assign(N * K, 0.f), r.dfn.assign(R * K, 0.f), r.dbase.assign(R, 0.f), r.dscale.assign(3, 0.f);
  trex::kern::hc_pre_bwd(s, in.x.data(), in.fn.data(), in.base.data(), in.scale.data(), mix.data(), rstd.data(),
                         in.dy.data(), in.dpost.data(), in.dcomb.data(), r.dx.data(), r.dfn.data(), r.dbase.data(),
                         r.dscale.data(), ws.data());
  r.out.resize(N * K), r.pdx.resize(N * K), r.df.resize(N * d), r.dpost.resize(N * n), r.dcomb.resize(N * n * n);
  trex::kern::hc_post_fwd(s, in.x.data(), in.f.data(), r.post.data(), r.comb.data(), r.out.data());
  trex::kern::hc_post_bwd(s, in.x.data(), in.f.data(), r.post.data(), r.comb.data(), in.dout.data(), r.pdx.data(),
                          r.df.data(), r.dpost.data(), r.dcomb.data());
  r.hy.resize(N * d), r.hdx.resize(N * K), r.hdfn.assign(n * K, 0.f), r.hdbase.assign(n, 0.f);
  r.hdscale.assign(1, 0.f);
  std::vector<float> hmix(N * n), hws(trex::kern::hc_head_bwd_workspace_floats(s));
  trex::kern::hc_head_fwd(s, in.x.data(), in.hfn.data(), in.hbase.data(), in.hscale.data(), r.hy.data(), hmix.data(),
                          rstd.data());
  trex::kern::hc_head_bwd(s, in.x.data(), in.hfn.data(), in.hbase.data(), in.hscale.data(), hmix.data(), rstd.data(),
                          in.dy.data(), r.hdx.data(), r.hdfn.data(), r.hdbase.data(), r.hdscale.data(), hws.data());
  return r;
}

// The scalar reference in precision T.
template <class T>
Results run_reference(const Inputs& in) {
  namespace ref = trex::kern::ref;
  const HcShape& s = in.s;
  const size_t N = s.N, n = s.n, d = s.d, R = (2 + n) * n, K = n * d;
  const auto x = cast<T>(in.x), fn = cast<T>(in.fn), base = cast<T>(in.base), scale = cast<T>(in.scale);
  const auto dy = cast<T>(in.dy), dpost_in = cast<T>(in.dpost), dcomb_in = cast<T>(in.dcomb);
  const auto f = cast<T>(in.f), dout = cast<T>(in.dout);
  const auto hfn = cast<T>(in.hfn), hbase = cast<T>(in.hbase), hscale = cast<T>(in.hscale);
  std::vector<T> y(N * d), post(N * n), comb(N * n * n), mix(N * R), rstd(N);
  ref::hc_pre_fwd<T>(s, x.data(), fn.data(), base.data(), scale.data(), y.data(), post.data(), comb.data(),
                     mix.data(), rstd.data());
  std::vector<T> dx(N * K, 0), dfn(R * K, 0), dbase(R, 0), dscale(3, 0);
  ref::hc_pre_bwd<T>(s, x.data(), fn.data(), base.data(), scale.data(), mix.data(), rstd.data(), dy.data(),
                     dpost_in.data(), dcomb_in.data(), dx.data(), dfn.data(), dbase.data(), dscale.data());
  std::vector<T> out(N * K), pdx(N * K), df(N * d), dpost(N * n), dcomb(N * n * n);
  ref::hc_post_fwd<T>(s, x.data(), f.data(), post.data(), comb.data(), out.data());
  ref::hc_post_bwd<T>(s, x.data(), f.data(), post.data(), comb.data(), dout.data(), pdx.data(), df.data(),
                      dpost.data(), dcomb.data());
  std::vector<T> hy(N * d), hmix(N * n), hdx(N * K), hdfn(n * K, 0), hdbase(n, 0), hdscale(1, 0);
  ref::hc_head_fwd<T>(s, x.data(), hfn.data(), hbase.data(), hscale.data(), hy.data(), hmix.data(), rstd.data());
  ref::hc_head_bwd<T>(s, x.data(), hfn.data(), hbase.data(), hscale.data(), hmix.data(), rstd.data(), dy.data(),
                      hdx.data(), hdfn.data(), hdbase.data(), hdscale.data());
  return Results{to_f32(y),   to_f32(post),  to_f32(comb),  to_f32(dx),    to_f32(dfn),    to_f32(dbase),
                 to_f32(dscale), to_f32(out), to_f32(pdx),  to_f32(df),    to_f32(dpost),  to_f32(dcomb),
                 to_f32(hy),  to_f32(hdx),   to_f32(hdfn),  to_f32(hdbase), to_f32(hdscale)};
}

// |got - want| <= tol * max(1, max|want|) element-wise (f32 rounding of a different summation
// order than torch's; the Sinkhorn backward amplifies it a little).
void expect_close(const char* what, const std::vector<float>& got, const float* want, size_t n, double tol) {
  ASSERT_EQ(got.size(), n) << what;
  double scale = 1, worst = 0;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  for (size_t i = 0; i < n; ++i) {
    const double e = std::abs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, e);
    EXPECT_LE(e, tol * scale) << what << "[" << i << "] got " << got[i] << " want " << want[i];
  }
  ::testing::Test::RecordProperty(what, std::to_string(worst / scale));
  if (std::getenv("HC_PRINT")) std::printf("%-14s worst rel err %.3g\n", what, worst / scale);
}

constexpr double kTol = 2e-6;

#define HC_EXPECT(R, field, C) expect_close(#C, R.field, C, sizeof(C) / sizeof(float), kTol)

void check_a(const Results& r) {
  HC_EXPECT(r, y, kAY);
  HC_EXPECT(r, post, kAPost);
  HC_EXPECT(r, comb, kAComb);
  HC_EXPECT(r, dx, kADx);
  HC_EXPECT(r, dfn, kADfn);
  HC_EXPECT(r, dbase, kADbase);
  HC_EXPECT(r, dscale, kADscale);
  HC_EXPECT(r, out, kAOut);
  HC_EXPECT(r, pdx, kAPostDx);
  HC_EXPECT(r, df, kADf);
  HC_EXPECT(r, dpost, kADpost);
  HC_EXPECT(r, dcomb, kADcomb);
  HC_EXPECT(r, hy, kAHeadY);
  HC_EXPECT(r, hdx, kAHeadDx);
  HC_EXPECT(r, hdfn, kAHeadDfn);
  HC_EXPECT(r, hdbase, kAHeadDbase);
  HC_EXPECT(r, hdscale, kAHeadDscale);
}

void check_b(const Results& r) {  // dfn / head dfn are not stored for B (576 values)
  HC_EXPECT(r, y, kBY);
  HC_EXPECT(r, post, kBPost);
  HC_EXPECT(r, comb, kBComb);
  HC_EXPECT(r, dx, kBDx);
  HC_EXPECT(r, dbase, kBDbase);
  HC_EXPECT(r, dscale, kBDscale);
  HC_EXPECT(r, out, kBOut);
  HC_EXPECT(r, pdx, kBPostDx);
  HC_EXPECT(r, df, kBDf);
  HC_EXPECT(r, dpost, kBDpost);
  HC_EXPECT(r, dcomb, kBDcomb);
  HC_EXPECT(r, hy, kBHeadY);
  HC_EXPECT(r, hdx, kBHeadDx);
  HC_EXPECT(r, hdbase, kBHeadDbase);
  HC_EXPECT(r, hdscale, kBHeadDscale);
}

const Inputs& inputs_a() {
  static const Inputs in = make_inputs(2, 3, 5, 4, 1e-2f, 0.1f);
  return in;
}
const Inputs& inputs_b() {
  static const Inputs in = make_inputs(2, 4, 6, 20, 1e-6f, 1e-6f);
  return in;
}

}  // namespace

TEST(HyperConnTorch, KernelsMatchTorchLargeEps) { check_a(run_kernels(inputs_a())); }
TEST(HyperConnTorch, ReferenceF32MatchesTorchLargeEps) { check_a(run_reference<float>(inputs_a())); }
TEST(HyperConnTorch, ReferenceF64MatchesTorchLargeEps) { check_a(run_reference<double>(inputs_a())); }
TEST(HyperConnTorch, KernelsMatchTorchModelConfig) { check_b(run_kernels(inputs_b())); }
TEST(HyperConnTorch, ReferenceF32MatchesTorchModelConfig) { check_b(run_reference<float>(inputs_b())); }
TEST(HyperConnTorch, ReferenceF64MatchesTorchModelConfig) { check_b(run_reference<double>(inputs_b())); }

// The post step uses comb transposed: with a one-hot comb[j][k] (j = 0, k = 1) only stream 1 of
// the output receives stream 0 of the input.
TEST(HyperConn, PostUsesCombTransposed) {
  const HcShape s{1, 2, 3, 1, 1e-6f, 1e-6f};
  const std::vector<float> x = {1, 2, 3, 10, 20, 30}, f = {0, 0, 0}, post = {0, 0}, comb = {0, 1, 0, 0};
  std::vector<float> out(6, -1.f);
  trex::kern::hc_post_fwd(s, x.data(), f.data(), post.data(), comb.data(), out.data());
  EXPECT_EQ(out, (std::vector<float>{0, 0, 0, 1, 2, 3}));
}

// Shapes are checked; N = 0 is a no-op.
TEST(HyperConn, BadShapesThrow) {
  std::vector<float> buf(1024, 0.f);
  const HcShape bad_n{1, 0, 4, 1, 1e-6f, 1e-6f}, bad_iters{1, 2, 4, 0, 1e-6f, 1e-6f}, empty{0, 2, 4, 3, 1e-6f, 1e-6f};
  float* p = buf.data();
  EXPECT_THROW(trex::kern::hc_pre_fwd(bad_n, p, p, p, p, p, p, p, p, p), trex::Error);
  EXPECT_THROW(trex::kern::hc_pre_fwd(bad_iters, p, p, p, p, p, p, p, p, p), trex::Error);
  EXPECT_NO_THROW(trex::kern::hc_pre_fwd(empty, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                         nullptr, nullptr));
}

// The coefficient math with the stream count as a compile-time constant (kernels/hd/hyper_conn.h,
// hc_coeffs_fwd_n / _bwd_n with NC = 4, what hc_coeffs_fwd / _bwd run for 4 streams on the CPU and
// on CUDA) gives the same bits as with the count at run time (NC = 0), forward and backward (with
// and without each incoming gradient), at several Sinkhorn depths and on inputs large enough to
// saturate the sigmoids and the softmax.
TEST(HyperConn, CoefficientsWithConstantStreamsEqualRunTime) {
  namespace hd = trex::kern::hd;
  constexpr int n = 4, R = (2 + n) * n;
  std::mt19937 g(11);
  for (float spread : {0.5f, 8.f})
    for (int iters : {1, 3, 20}) {
      SCOPED_TRACE("iters=" + std::to_string(iters) + " spread=" + std::to_string(spread));
      std::normal_distribution<float> nd(0.f, spread);
      std::vector<float> mix(R), base(R), scale(3), dpre(n), dpost(n), dcomb(n * n);
      for (auto* v : {&mix, &base, &scale, &dpre, &dpost, &dcomb})
        for (float& e : *v) e = nd(g);
      const float eps = 1e-6f;
      const size_t cs = hd::hc_coeffs_scratch(n, iters);
      std::vector<float> pre(n), post(n), comb(n * n), hist(2 * iters * n * n);
      std::vector<float> pre_r(n), post_r(n), comb_r(n * n), hist_r(2 * iters * n * n);
      hd::hc_coeffs_fwd_n<float, 4>(n, iters, eps, mix.data(), base.data(), scale.data(), pre.data(),
                                    post.data(), comb.data(), hist.data());
      hd::hc_coeffs_fwd_n<float, 0>(n, iters, eps, mix.data(), base.data(), scale.data(), pre_r.data(),
                                    post_r.data(), comb_r.data(), hist_r.data());
      auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
        return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      };
      EXPECT_TRUE(same(pre, pre_r) && same(post, post_r) && same(comb, comb_r) && same(hist, hist_r)) << "forward";
      for (int with = 0; with < 8; ++with) {
        const float* dp = with & 1 ? dpre.data() : nullptr;
        const float* dq = with & 2 ? dpost.data() : nullptr;
        const float* dc = with & 4 ? dcomb.data() : nullptr;
        std::vector<float> dz(R), dz_r(R), pb(n), pb_r(n), scr(cs), scr_r(cs);
        hd::hc_coeffs_bwd_n<float, 4>(n, iters, eps, mix.data(), base.data(), scale.data(), dp, dq, dc,
                                      dz.data(), pb.data(), scr.data());
        hd::hc_coeffs_bwd_n<float, 0>(n, iters, eps, mix.data(), base.data(), scale.data(), dp, dq, dc,
                                      dz_r.data(), pb_r.data(), scr_r.data());
        EXPECT_TRUE(same(dz, dz_r) && same(pb, pb_r)) << "backward, incoming gradients " << with;
      }
    }
}

// hc_pre_bwd_then_post gives the bits of hc_pre_bwd followed by hc_post_bwd on the dx it leaves,
// leaves dx as it was, and may write the post step's dpost / dcomb over the pre step's own:
// one chunk and several, token tails, 4 streams (the 16-token coefficient path) and others, widths
// off the 32-column blocks.
TEST(HyperConn, PreThenPostEqualsTheTwoSteps) {
  namespace k = trex::kern;
  std::mt19937 g(23);
  std::normal_distribution<float> nd;
  struct Case {
    int64_t N;
    int n;
    int64_t d;
  };
  for (const Case c : {Case{70, 4, 100}, Case{301, 4, 257}, Case{33, 3, 37}, Case{16, 1, 7}, Case{9, 4, 64}}) {
    SCOPED_TRACE("N=" + std::to_string(c.N) + " n=" + std::to_string(c.n) + " d=" + std::to_string(c.d));
    const HcShape s{c.N, c.n, c.d, 3, 1e-6f, 1e-6f};
    const int64_t N = c.N, n = c.n, d = c.d, K = n * d, R = (2 + n) * n;
    auto rnd = [&](int64_t len, float sc = 1.f) {
      std::vector<float> v(len);
      for (float& e : v) e = sc * nd(g);
      return v;
    };
    const std::vector<float> x = rnd(N * K), fn = rnd(R * K, 0.05f), base = rnd(R, 0.1f), scale = rnd(3, 0.5f);
    std::vector<float> y(N * d), post(N * n), comb(N * n * n), mix(N * R), rstd(N);
    k::hc_pre_fwd(s, x.data(), fn.data(), base.data(), scale.data(), y.data(), post.data(), comb.data(), mix.data(),
                  rstd.data());
    const std::vector<float> dy = rnd(N * d), dpost = rnd(N * n), dcomb = rnd(N * n * n), dx0 = rnd(N * K);
    const std::vector<float> x2 = rnd(N * K), f2 = rnd(N * d), post2 = rnd(N * n), comb2 = rnd(N * n * n);
    std::vector<float> ws(k::hc_pre_bwd_workspace_floats(s));
    struct Out {
      std::vector<float> dX, df, dpost, dcomb, dfn, dbase, dscale;
    };
    auto fresh = [&] {
      return Out{std::vector<float>(N * K, NAN), std::vector<float>(N * d, NAN), std::vector<float>(N * n, NAN),
                 std::vector<float>(N * n * n, NAN), std::vector<float>(R * K, 0.f), std::vector<float>(R, 0.f),
                 std::vector<float>(3, 0.f)};
    };
    Out a = fresh();
    std::vector<float> dxa(dx0);
    k::hc_pre_bwd(s, x.data(), fn.data(), base.data(), scale.data(), mix.data(), rstd.data(), dy.data(),
                  dpost.data(), dcomb.data(), dxa.data(), a.dfn.data(), a.dbase.data(), a.dscale.data(), ws.data());
    k::hc_post_bwd(s, x2.data(), f2.data(), post2.data(), comb2.data(), dxa.data(), a.dX.data(), a.df.data(),
                   a.dpost.data(), a.dcomb.data());
    for (bool alias : {false, true}) {
      SCOPED_TRACE(alias ? "dpost / dcomb written over the inputs" : "separate outputs");
      Out b = fresh();
      std::vector<float> dxb(dx0), dp(dpost), dc(dcomb);
      float* op = alias ? dp.data() : b.dpost.data();
      float* oc = alias ? dc.data() : b.dcomb.data();
      k::hc_pre_bwd_then_post(s, x.data(), fn.data(), base.data(), scale.data(), mix.data(), rstd.data(), dy.data(),
                              dp.data(), dc.data(), dxb.data(), b.dfn.data(), b.dbase.data(), b.dscale.data(),
                              ws.data(), {x2.data(), f2.data(), post2.data(), comb2.data(), b.dX.data(), b.df.data(), op, oc});
      if (alias) b.dpost = dp, b.dcomb = dc;
      auto same = [](const std::vector<float>& u, const std::vector<float>& v) {
        return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0;
      };
      EXPECT_TRUE(same(dxb, dx0)) << "dx changed";
      EXPECT_TRUE(same(a.dX, b.dX)) << "dX";
      EXPECT_TRUE(same(a.df, b.df)) << "df";
      EXPECT_TRUE(same(a.dpost, b.dpost)) << "dpost";
      EXPECT_TRUE(same(a.dcomb, b.dcomb)) << "dcomb";
      EXPECT_TRUE(same(a.dfn, b.dfn)) << "dfn";
      EXPECT_TRUE(same(a.dbase, b.dbase)) << "dbase";
      EXPECT_TRUE(same(a.dscale, b.dscale)) << "dscale";
    }
  }
}
